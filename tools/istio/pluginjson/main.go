// pluginjson prints, for every WasmPlugin in the given YAML files, the plugin
// configuration string Istio hands to the Wasm filter: the spec is decoded
// into istio.io/api's WasmPlugin (strictly: unknown fields are an error) and
// its pluginConfig (a google.protobuf.Struct) serialised with Istio's
// protomarshal.ToJSON, as pilot does when it builds the filter
// (pilot/pkg/model/extensions.go). One JSON object per line:
//
//	{"file": ..., "name": ..., "configuration": "<the string on_configure receives>"}
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	extensions "istio.io/api/extensions/v1alpha1"
	"istio.io/istio/pkg/util/protomarshal"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pluginjson <file.yaml>...")
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, file := range os.Args[1:] {
		data, err := os.ReadFile(file)
		if err != nil {
			fail(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			var obj struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
				Spec json.RawMessage `json:"spec"`
			}
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				fail(fmt.Errorf("%s: %v", file, err))
			}
			if obj.Kind != "WasmPlugin" {
				continue
			}
			wp := &extensions.WasmPlugin{}
			if err := protomarshal.ApplyJSONStrict(string(obj.Spec), wp); err != nil {
				fail(fmt.Errorf("%s: WasmPlugin %s: %v", file, obj.Metadata.Name, err))
			}
			cfg, err := protomarshal.ToJSON(wp.PluginConfig)
			if err != nil {
				fail(fmt.Errorf("%s: WasmPlugin %s: pluginConfig: %v", file, obj.Metadata.Name, err))
			}
			if err := out.Encode(map[string]string{"file": file, "name": obj.Metadata.Name, "configuration": cfg}); err != nil {
				fail(err)
			}
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
