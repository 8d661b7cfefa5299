// istioclusters prints the Envoy clusters istiod would push to a proxy, computed
// by Istio's own code from rendered manifests: pilot's discovery server
// (istio.io/istio/pilot/test/xds.NewFakeDiscoveryServer: the Kubernetes service
// registry over a fake API server, the ambient index, the Gateway API
// controller, EnvoyFilter patching) and ConfigGeneratorImpl.BuildClusters.
//
//	istioclusters [-sidecar NS/APP]... [-waypoint NS/GATEWAY]... file.yaml...
//
// The files are what `kustomize build` gives (Namespaces, Services, Deployments,
// Istio and Gateway API resources). What a live cluster adds on its own is
// synthesised, and only that: a ClusterIP for each Service, Ready Pods for each
// Deployment's replicas (annotated as captured by ztunnel in ambient namespaces,
// as istio-cni does), and for each Gateway of class istio-waypoint the Service,
// the Pod and the status address that Istio's gateway deployment controller
// would create (and the istio-waypoint GatewayClass istiod installs).
//
// Prints one JSON object per proxy: {"proxy": "sidecar:NS/APP" or
// "waypoint:NS/GATEWAY", "clusters": {name: cluster (proto JSON, proto field
// names)}}. Exits 1 with Istio's error when the manifests or a proxy cannot be
// set up.
//
// Ambient features read PILOT_ENABLE_AMBIENT when the process starts; as istiod
// installed with the ambient profile, it is set to true (the program re-executes
// itself with it when it is unset).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"

	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"istio.io/api/label"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config/constants"
	"istio.io/istio/pkg/log"
	"istio.io/istio/pkg/test"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

type object = map[string]any

func main() {
	if os.Getenv("PILOT_ENABLE_AMBIENT") == "" {
		self, err := os.Executable()
		check(err)
		env := append(os.Environ(), "PILOT_ENABLE_AMBIENT=true")
		check(syscall.Exec(self, os.Args, env))
	}
	var sidecars, waypoints multi
	flag.Var(&sidecars, "sidecar", "NS/APP: the sidecar of a pod labelled app=APP in namespace NS (repeatable)")
	flag.Var(&waypoints, "waypoint", "NS/GATEWAY: the waypoint of Gateway GATEWAY in namespace NS (repeatable)")
	flag.Parse()
	if flag.NArg() == 0 || len(sidecars)+len(waypoints) == 0 {
		fmt.Fprintln(os.Stderr, "usage: istioclusters [-sidecar NS/APP]... [-waypoint NS/GATEWAY]... file.yaml...")
		os.Exit(2)
	}
	logOpts := log.DefaultOptions()
	logOpts.OutputPaths = []string{"stderr"}
	logOpts.ErrorOutputPaths = []string{"stderr"}
	logOpts.SetDefaultOutputLevel(log.OverrideScopeName, log.WarnLevel)
	check(log.Configure(logOpts))

	var docs []object
	for _, file := range flag.Args() {
		data, err := os.ReadFile(file)
		check(err)
		for _, doc := range strings.Split(string(data), "\n---") {
			var obj object
			check(yaml.Unmarshal([]byte(doc), &obj))
			if obj != nil {
				docs = append(docs, obj)
			}
		}
	}
	w := synthesise(docs)
	manifests := render(w.objects)

	out := json.NewEncoder(os.Stdout)
	err := test.Wrap(func(t test.Failer) {
		d := xds.NewFakeDiscoveryServer(t, xds.FakeOptions{
			ConfigString:           manifests,
			KubernetesObjectString: manifests,
		})
		for _, spec := range sidecars {
			check(out.Encode(proxyClusters(d, model.SidecarProxy, "sidecar:"+spec, w.pod(spec))))
		}
		for _, spec := range waypoints {
			check(out.Encode(proxyClusters(d, model.Waypoint, "waypoint:"+spec, w.waypointPod(spec))))
		}
	})
	check(err)
}

// proxyClusters sets up the proxy of `pod` as istiod does when it connects, and builds its clusters.
func proxyClusters(d *xds.FakeDiscoveryServer, typ model.NodeType, name string, pod pod) map[string]any {
	p := d.SetupProxy(&model.Proxy{
		Type:            typ,
		ID:              pod.name + "." + pod.namespace,
		ConfigNamespace: pod.namespace,
		Labels:          pod.labels,
		IPAddresses:     []string{pod.ip},
		Metadata:        &model.NodeMetadata{Namespace: pod.namespace, Labels: pod.labels},
	})
	out := map[string]json.RawMessage{}
	for _, c := range d.Clusters(p) {
		js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(c)
		check(err)
		out[c.Name] = js
	}
	return map[string]any{"proxy": name, "clusters": out}
}

type pod struct {
	name, namespace, ip string
	labels              map[string]string
}

type world struct {
	objects   []object
	pods      []pod
	waypoints map[string]pod // "ns/gateway" -> its pod
}

func (w *world) pod(spec string) pod {
	ns, app, ok := strings.Cut(spec, "/")
	if !ok {
		fail("-sidecar %q: expected NS/APP", spec)
	}
	for _, p := range w.pods {
		if p.namespace == ns && p.labels["app"] == app {
			return p
		}
	}
	fail("-sidecar %s: no Deployment in the manifests makes a pod labelled app=%s in namespace %s", spec, app, ns)
	return pod{}
}

func (w *world) waypointPod(spec string) pod {
	p, ok := w.waypoints[spec]
	if !ok {
		fail("-waypoint %s: no Gateway of class istio-waypoint with that namespace/name in the manifests", spec)
	}
	return p
}

func str(o object, path ...string) string {
	var cur any = o
	for _, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[k]
	}
	s, _ := cur.(string)
	return s
}

func mapAt(o object, path ...string) map[string]any {
	cur := o
	for _, k := range path {
		next, ok := cur[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[k] = next
		}
		cur = next
	}
	return cur
}

func stringMap(m map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}

// synthesise adds what the API server and Istio's controllers would create.
func synthesise(docs []object) *world {
	w := &world{waypoints: map[string]pod{}}
	ambient := map[string]bool{}
	for _, d := range docs {
		if d["kind"] == "Namespace" {
			ambient[str(d, "metadata", "name")] = str(d, "metadata", "labels", "istio.io/dataplane-mode") == "ambient"
		}
	}
	classAdded := false
	svcN, podN := 0, 0
	nextServiceIP := func() string { svcN++; return fmt.Sprintf("10.96.%d.%d", svcN/250, svcN%250+1) }
	nextPodIP := func() string { podN++; return fmt.Sprintf("10.244.%d.%d", podN/250, podN%250+1) }
	for _, d := range docs {
		ns := str(d, "metadata", "namespace")
		switch d["kind"] {
		case "Service":
			spec := mapAt(d, "spec")
			if _, ok := spec["clusterIP"]; !ok {
				spec["clusterIP"] = nextServiceIP()
			}
		case "Deployment":
			replicas := 1
			if r, ok := mapAt(d, "spec")["replicas"].(float64); ok {
				replicas = int(r)
			}
			labels := stringMap(mapAt(d, "spec", "template", "metadata", "labels"))
			for i := 0; i < replicas; i++ {
				p := pod{name: fmt.Sprintf("%s-%d", str(d, "metadata", "name"), i), namespace: ns, ip: nextPodIP(), labels: labels}
				w.pods = append(w.pods, p)
				w.objects = append(w.objects, podObject(p, ambient[ns]))
			}
		case "Gateway":
			if str(d, "spec", "gatewayClassName") != constants.WaypointGatewayClassName {
				break
			}
			if !classAdded {
				// istiod creates its GatewayClasses itself (gatewayclass controller).
				w.objects = append(w.objects, object{
					"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
					"metadata": object{"name": constants.WaypointGatewayClassName},
					"spec":     object{"controllerName": constants.ManagedGatewayMeshController},
				})
				classAdded = true
			}
			name := str(d, "metadata", "name")
			host := fmt.Sprintf("%s.%s.svc.cluster.local", name, ns)
			d["status"] = map[string]any{"addresses": []any{map[string]any{"type": "Hostname", "value": host}}}
			labels := map[string]string{
				label.IoK8sNetworkingGatewayGatewayName.Name: name,
				label.GatewayManaged.Name:                    constants.ManagedGatewayMeshControllerLabel,
			}
			w.objects = append(w.objects, object{
				"apiVersion": "v1", "kind": "Service",
				"metadata": object{"name": name, "namespace": ns, "labels": labels},
				"spec": object{
					"clusterIP": nextServiceIP(),
					"ports":     []any{object{"name": "mesh", "port": 15008, "appProtocol": "hbone"}},
					"selector":  object{label.IoK8sNetworkingGatewayGatewayName.Name: name},
				},
			})
			p := pod{name: name + "-0", namespace: ns, ip: nextPodIP(), labels: labels}
			w.waypoints[ns+"/"+name] = p
			w.objects = append(w.objects, podObject(p, false))
		}
		w.objects = append(w.objects, d)
	}
	return w
}

func podObject(p pod, captured bool) object {
	meta := object{"name": p.name, "namespace": p.namespace, "labels": p.labels}
	if captured {
		meta["annotations"] = object{"ambient.istio.io/redirection": "enabled"}
	}
	return object{
		"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": object{},
		"status": object{
			"conditions": []any{object{"type": "Ready", "status": "True"}},
			"podIP":      p.ip, "podIPs": []any{object{"ip": p.ip}},
		},
	}
}

func render(objects []object) string {
	// Namespaces first, then in input order: the registries see a namespace before its objects.
	sort.SliceStable(objects, func(i, j int) bool {
		return objects[i]["kind"] == "Namespace" && objects[j]["kind"] != "Namespace"
	})
	parts := make([]string, 0, len(objects))
	for _, o := range objects {
		b, err := yaml.Marshal(o)
		check(err)
		parts = append(parts, string(b))
	}
	return strings.Join(parts, "\n---\n")
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
