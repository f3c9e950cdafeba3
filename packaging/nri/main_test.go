package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
)

func TestGPUReason(t *testing.T) {
	cases := []struct {
		name string
		c    *api.Container
		want string
	}{
		{"nothing", &api.Container{Env: []string{"PATH=/bin"}}, ""},
		{"env all", &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, "NVIDIA_VISIBLE_DEVICES=all"},
		{"env void wins last", &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"}}, ""},
		{"env none", &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=none"}}, ""},
		{"env empty", &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES="}}, ""},
		{"CDI device", &api.Container{CDIDevices: []*api.CDIDevice{{Name: "nvidia.com/gpu=0"}}}, "CDI device nvidia.com/gpu=0"},
		{"DRA claim device", &api.Container{CDIDevices: []*api.CDIDevice{{Name: "k8s.gpu.nvidia.com/claim=abc"}}}, "CDI device k8s.gpu.nvidia.com/claim=abc"},
		{"other vendor's CDI device", &api.Container{CDIDevices: []*api.CDIDevice{{Name: "example.com/dev=0"}}}, ""},
		{"cdi annotation", &api.Container{Annotations: map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=0"}}, "annotation cdi.k8s.io/x"},
		{"nvidia annotation", &api.Container{Annotations: map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=all"}}, "annotation nvidia.cdi.k8s.io/container.c"},
		{"unrelated annotation", &api.Container{Annotations: map[string]string{"cdi.k8s.io/x": "example.com/dev=0"}}, ""},
		{"device node", &api.Container{Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia3"}}}}, "device /dev/nvidia3"},
		{"nvidiactl", &api.Container{Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidiactl"}}}}, "device /dev/nvidiactl"},
		{"not a GPU node", &api.Container{Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia-modeset"}}}}, ""},
	}
	for _, tc := range cases {
		if got := gpuReason(nil, tc.c); got != tc.want {
			t.Errorf("%s: gpuReason = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// NVIDIA's plugin reads its annotation on the pod, for this container, the whole pod, or bare.
func TestGPUReasonPodAnnotation(t *testing.T) {
	c := &api.Container{Name: "c"}
	cases := []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"this container", map[string]string{"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=0"}, "pod annotation nvidia.cdi.k8s.io (nvidia.com/gpu=0)"},
		{"whole pod", map[string]string{"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"}, "pod annotation nvidia.cdi.k8s.io (nvidia.com/gpu=all)"},
		{"another container", map[string]string{"nvidia.cdi.k8s.io/container.d": "nvidia.com/gpu=0"}, ""},
		{"this container wins", map[string]string{"nvidia.cdi.k8s.io/container.c": "example.com/x=0", "nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=0"}, ""},
		{"no annotations", nil, ""},
	}
	for _, tc := range cases {
		if got := gpuReason(&api.PodSandbox{Annotations: tc.ann}, c); got != tc.want {
			t.Errorf("%s: gpuReason = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestParseConfig(t *testing.T) {
	if _, err := parseConfig([]byte("not json")); err == nil {
		t.Error("bad JSON accepted")
	}
	if _, err := parseConfig([]byte(`{"hook": {"path": "relative", "args": ["x"]}}`)); err == nil {
		t.Error("a relative hook path accepted")
	}
	if _, err := parseConfig([]byte(`{"hook": {"path": "/bin/true", "args": ["true"]}, "stages": ["prestart"]}`)); err == nil {
		t.Error("a stage other than createContainer accepted")
	}
	c, err := parseConfig([]byte(`{"hook": {"path": "/bin/true", "args": ["true"], "timeout": 30}, "log_file": "/l"}`))
	if err != nil || c.Stages[0] != "createContainer" || *c.Hook.Timeout != 30 || c.LogFile != "/l" {
		t.Fatalf("parseConfig: %v %+v", err, c)
	}
}

func configured(t *testing.T) *plugin {
	t.Helper()
	p := &plugin{}
	if _, err := p.Configure(context.Background(), `{"hook": {"path": "/usr/bin/python3", "args": ["python3", "-c", "x"], "env": ["A=1"], "timeout": 30}}`, "containerd", "2.1"); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCreateContainerRoutesOnlyGPUContainers(t *testing.T) {
	p := configured(t)
	gpu := &api.Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}
	adj, _, err := p.CreateContainer(context.Background(), nil, gpu)
	if err != nil || adj == nil || len(adj.GetHooks().GetCreateContainer()) != 1 {
		t.Fatalf("GPU container: %v %v", adj, err)
	}
	h := adj.GetHooks().GetCreateContainer()[0]
	if h.Path != "/usr/bin/python3" || strings.Join(h.Args, " ") != "python3 -c x" || h.Env[0] != "A=1" || h.Timeout.GetValue() != 30 {
		t.Errorf("hook %+v", h)
	}
	for name, c := range map[string]*api.Container{
		"non-GPU":   {Env: []string{"PATH=/bin"}},
		"opted out": {Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Annotations: map[string]string{"compat-hook/disable": "true"}},
		"has it":    {Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}, Hooks: &api.Hooks{CreateContainer: []*api.Hook{h}}},
	} {
		if adj, _, err := p.CreateContainer(context.Background(), nil, c); adj != nil || err != nil {
			t.Errorf("%s: adjusted %v (%v)", name, adj, err)
		}
	}
}

func TestConfigureRefusesNoConfiguration(t *testing.T) {
	p := &plugin{}
	if _, err := p.Configure(context.Background(), "", "containerd", "2.1"); err == nil {
		t.Error("no configuration accepted")
	}
	f := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(f, []byte(`{"hook": {"path": "/bin/true", "args": ["true"]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p = &plugin{configFile: f}
	if _, err := p.Configure(context.Background(), "", "containerd", "2.1"); err != nil {
		t.Errorf("-config file: %v", err)
	}
}

func TestProcessStartIsThisProcesssStart(t *testing.T) {
	start := processStart(uint32(os.Getpid()))
	if start <= 0 {
		t.Fatal("no start time")
	}
	if exe, _ := os.Executable(); exe != "" {
		if st, err := os.Stat(exe); err == nil && start < st.ModTime().UnixNano()-2e9 {
			t.Errorf("started %d before its own binary was written (%d)", start, st.ModTime().UnixNano())
		}
	}
}
