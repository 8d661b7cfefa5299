// istiowasm turns the shipped WasmPlugins and EnvoyFilters into the Envoy Wasm
// filter configuration an Istio proxy would run, with Istio's own code:
//
//   - WasmPlugin: decoded strictly into istio.io/api's WasmPlugin, mapped field
//     for field to the TrafficExtension that istiod synthesises from it
//     (pilot/pkg/config/kube/extensions/translate.go), and built into the Envoy
//     filter by pilot's TrafficExtensionWrapper.BuildHTTPWasmFilter
//     (pluginConfig -> JSON string, root_id, failure policy, remote code + sha256);
//   - EnvoyFilter: each EXTENSION_CONFIG patch value decoded by Istio's
//     xds.BuildXDSObjectFromStruct (strict).
//
// Then, as istio-agent does for ECDS, wasm.MaybeConvertWasmExtensionConfig pulls
// the module through a wasm.LocalFileCache (checking the pinned sha256 against
// the image's manifest digest) and rewrites the code to the local file. The
// registry host of every oci:// URL is replaced by -registry (the test's local
// registry stands in for the one in the manifests).
//
//	istiowasm -registry 127.0.0.1:5000 -cache DIR file.yaml...
//
// Prints one JSON object per plugin: {"file","kind","name","config"}, config
// being the filter's `config` (envoy.extensions.wasm.v3.PluginConfig, proto
// field names). Exits 1 if Istio would not run the plugin (e.g. it replaced it
// with its deny-all RBAC filter because the fetch or the checksum failed).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpwasm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pkg/config/xds"
	"istio.io/istio/pkg/log"
	"istio.io/istio/pkg/util/protomarshal"
	"istio.io/istio/pkg/util/sets"
	"istio.io/istio/pkg/wasm"
	"sigs.k8s.io/yaml"
)

var ociHost = regexp.MustCompile(`^oci://[^/]+/`)

func main() {
	registry := flag.String("registry", "", "registry host:port replacing the one in oci:// URLs")
	cacheDir := flag.String("cache", "", "directory for istio-agent's module cache")
	flag.Parse()
	if *registry == "" || *cacheDir == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: istiowasm -registry HOST:PORT -cache DIR file.yaml...")
		os.Exit(2)
	}
	// Istio's log (the agent's fetch messages and errors) to stderr; stdout is ours.
	logOpts := log.DefaultOptions()
	logOpts.OutputPaths = []string{"stderr"}
	check(log.Configure(logOpts))
	cache := wasm.NewLocalFileCache(*cacheDir, wasm.Options{
		InsecureRegistries: sets.New(*registry),
		HTTPRequestTimeout: 30 * time.Second,
	})
	defer cache.Cleanup()
	out := json.NewEncoder(os.Stdout)
	for _, file := range flag.Args() {
		data, err := os.ReadFile(file)
		check(err)
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			var obj struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
				Spec json.RawMessage `json:"spec"`
			}
			check(yaml.Unmarshal(doc, &obj))
			var exts []*core.TypedExtensionConfig
			switch obj.Kind {
			case "WasmPlugin":
				exts = append(exts, fromWasmPlugin(obj.Metadata.Name, obj.Metadata.Namespace, obj.Spec))
			case "EnvoyFilter":
				exts = fromEnvoyFilter(obj.Metadata.Name, obj.Spec)
			default:
				continue
			}
			for _, ec := range exts {
				cfg := convert(ec, *registry, cache)
				js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(cfg)
				check(err)
				check(out.Encode(map[string]any{"file": file, "kind": obj.Kind, "name": obj.Metadata.Name,
					"extension": ec.Name, "config": json.RawMessage(js)}))
			}
		}
	}
}

func fromWasmPlugin(name, namespace string, spec []byte) *core.TypedExtensionConfig {
	wp := &extensions.WasmPlugin{}
	if err := protomarshal.ApplyJSONStrict(string(spec), wp); err != nil {
		fail("WasmPlugin %s: %v", name, err)
	}
	te := &extensions.TrafficExtension{
		Selector:   wp.Selector,
		TargetRefs: wp.TargetRefs,
		Phase:      extensions.TrafficExtension_ExecutionPhase(wp.Phase),
		Priority:   wp.Priority,
		FilterConfig: &extensions.TrafficExtension_Wasm{Wasm: &extensions.WasmConfig{
			Url: wp.Url, Sha256: wp.Sha256, ImagePullPolicy: wp.ImagePullPolicy, ImagePullSecret: wp.ImagePullSecret,
			PluginConfig: wp.PluginConfig, PluginName: wp.PluginName, FailStrategy: wp.FailStrategy,
			VmConfig: wp.VmConfig, Type: wp.Type,
		}},
	}
	w := &model.TrafficExtensionWrapper{TrafficExtension: te, Name: name, Namespace: namespace, ResourceVersion: "1"}
	filter := w.BuildHTTPWasmFilter()
	if filter == nil || filter.Config == nil {
		fail("WasmPlugin %s: Istio builds no HTTP Wasm filter from it", name)
	}
	tc, err := anypb.New(filter)
	check(err)
	return &core.TypedExtensionConfig{Name: namespace + "." + name, TypedConfig: tc}
}

func fromEnvoyFilter(name string, spec []byte) []*core.TypedExtensionConfig {
	ef := &networking.EnvoyFilter{}
	if err := protomarshal.ApplyJSONStrict(string(spec), ef); err != nil {
		fail("EnvoyFilter %s: %v", name, err)
	}
	var out []*core.TypedExtensionConfig
	for _, p := range ef.ConfigPatches {
		if p.ApplyTo != networking.EnvoyFilter_EXTENSION_CONFIG {
			continue
		}
		msg, err := xds.BuildXDSObjectFromStruct(p.ApplyTo, p.Patch.Value, true)
		if err != nil {
			fail("EnvoyFilter %s: %v", name, err)
		}
		out = append(out, msg.(*core.TypedExtensionConfig))
	}
	return out
}

// convert points the module at the test registry and runs istio-agent's conversion.
func convert(ec *core.TypedExtensionConfig, registry string, cache wasm.Cache) *httpwasm.Wasm {
	filter := &httpwasm.Wasm{}
	check(ec.TypedConfig.UnmarshalTo(filter))
	remote := filter.GetConfig().GetVmConfig().GetCode().GetRemote()
	if remote == nil {
		fail("%s: no remote code", ec.Name)
	}
	remote.HttpUri.Uri = ociHost.ReplaceAllString(remote.HttpUri.Uri, "oci://"+registry+"/")
	tc, err := anypb.New(filter)
	check(err)
	ec.TypedConfig = tc
	res, err := anypb.New(ec)
	check(err)
	resources := []*anypb.Any{res}
	if err := wasm.MaybeConvertWasmExtensionConfig(resources, cache); err != nil {
		fail("%s: %v", ec.Name, err)
	}
	got := &core.TypedExtensionConfig{}
	check(resources[0].UnmarshalTo(got))
	converted := &httpwasm.Wasm{}
	if err := got.TypedConfig.UnmarshalTo(converted); err != nil {
		fail("%s: istio-agent did not keep the Wasm filter (it put %s in its place)", ec.Name, got.TypedConfig.TypeUrl)
	}
	if converted.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename() == "" {
		fail("%s: code was not converted to a local file", ec.Name)
	}
	return converted
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
