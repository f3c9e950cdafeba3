package main

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
)

// routingCase is one row of testdata/routing-cases.json, the table compat-hook's agent
// (compat_hook/cluster/workload/runs.py, tests/test_runs.py) is tested against too.
type routingCase struct {
	Name string `json:"name"`
	Pod  struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Containers []struct {
				Name string `json:"name"`
				Env  []struct {
					Name  string `json:"name"`
					Value string `json:"value"`
				} `json:"env"`
			} `json:"containers"`
		} `json:"spec"`
	} `json:"pod"`
	Engine struct {
		Annotations map[string]string `json:"annotations"`
		Env         []string          `json:"env"`
		CDIDevices  []string          `json:"cdi_devices"`
		Devices     []string          `json:"devices"`
	} `json:"engine"`
	GPU          bool              `json:"gpu"`
	NRIReason    *string           `json:"nri_reason"`
	Routed       bool              `json:"routed"`
	EffectiveNRI map[string]string `json:"effective_nri"`
}

// reasonClass: gpuReason's answer as the table's class.
func reasonClass(r string) string {
	for _, p := range []struct{ prefix, class string }{
		{"CDI device ", "cdi-device"}, {"pod annotation ", "pod-annotation"}, {"annotation ", "annotation"},
		{"NVIDIA_VISIBLE_DEVICES=", "env"}, {"device ", "device"},
	} {
		if strings.HasPrefix(r, p.prefix) {
			return p.class
		}
	}
	return r
}

// The container as the engine hands it to the plugin: the pod's env, then what the device plugin or
// the CDI edits added; the container's own annotations; its CDI devices and device nodes.
func (rc *routingCase) request() (*api.PodSandbox, *api.Container) {
	spec := rc.Pod.Spec.Containers[0]
	c := &api.Container{Name: spec.Name, Annotations: rc.Engine.Annotations, Linux: &api.LinuxContainer{}}
	for _, e := range spec.Env {
		c.Env = append(c.Env, e.Name+"="+e.Value)
	}
	c.Env = append(c.Env, rc.Engine.Env...)
	for _, d := range rc.Engine.CDIDevices {
		c.CDIDevices = append(c.CDIDevices, &api.CDIDevice{Name: d})
	}
	for _, d := range rc.Engine.Devices {
		c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: d})
	}
	return &api.PodSandbox{Name: "p", Namespace: "ml", Annotations: rc.Pod.Metadata.Annotations}, c
}

func TestRoutingTable(t *testing.T) {
	b, err := os.ReadFile("testdata/routing-cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []routingCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 10 {
		t.Fatalf("%d cases", len(doc.Cases))
	}
	p := configured(t)
	for _, rc := range doc.Cases {
		pod, c := rc.request()
		got := gpuReason(pod, c)
		want := ""
		if rc.NRIReason != nil {
			want = *rc.NRIReason
		}
		if (got != "") != rc.GPU || reasonClass(got) != want {
			t.Errorf("%s: gpuReason = %q (%s), want gpu=%v %q", rc.Name, got, reasonClass(got), rc.GPU, want)
		}
		adj, _, err := p.CreateContainer(context.Background(), pod, c)
		if err != nil || (adj != nil) != rc.Routed {
			t.Errorf("%s: CreateContainer adjusted=%v (%v), want routed=%v", rc.Name, adj != nil, err, rc.Routed)
			continue
		}
		if adj == nil {
			continue
		}
		added := map[string]string{}
		for k, v := range adj.GetAnnotations() {
			added[k] = v
		}
		want2 := rc.EffectiveNRI
		if want2 == nil {
			want2 = map[string]string{}
		}
		if !reflect.DeepEqual(added, want2) {
			t.Errorf("%s: annotations added %v, want the pod's switches %v", rc.Name, added, want2)
		}
	}
}

// The container's own annotation wins over its pod's, for the switch and for what is handed on.
func TestContainerAnnotationWinsOverThePods(t *testing.T) {
	p := configured(t)
	pod := &api.PodSandbox{Annotations: map[string]string{"compat-hook/disable": "true", "compat-hook/dry-run": "true"}}
	c := &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Annotations: map[string]string{"compat-hook/disable": "false", "compat-hook/dry-run": "false"}}
	adj, _, err := p.CreateContainer(context.Background(), pod, c)
	if err != nil || adj == nil || len(adj.GetAnnotations()) != 0 {
		t.Fatalf("adjusted %v (%v): want the hook and no annotation", adj, err)
	}
}
