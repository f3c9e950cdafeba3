// compat-hook-nri: an NRI plugin that adds compat-hook's createContainer hook to every container
// that asks for a GPU, on engines that never name compat-hook's runtime (containerd 2.x with CDI,
// the GPU Operator's default since v25.10).
//
// The plugin only routes. The hook entry it adds (path, args, env, timeout) is the one
// `compat-hook install containerd --via nri` rendered from compat-hook's own registration code
// (the same entry the runtime wrapper and the hooks.d file carry), and every decision is taken by
// that hook when it runs. The plugin reads the entry from its configuration: the text the engine
// hands over at Configure (a pre-registered plugin's <plugin_config_path>/<idx>-<name>.conf), else
// the file named by -config.
//
// Two ways to run, one binary:
//   - pre-registered: the engine starts <plugin_path>/<idx>-<name> at its own start and hands it a
//     connected socket (NRI_PLUGIN_SOCKET); the plugin exits when that connection closes, and the
//     engine starts it again at its next start;
//   - external (-socket, a DaemonSet or a service): it connects to the engine's NRI socket and,
//     whenever the connection is lost (the engine restarted), reconnects with a jittered backoff.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	nriplugin "github.com/containerd/nri/pkg/plugin"
	"github.com/containerd/nri/pkg/stub"
)

const (
	defaultName = "compat-hook"
	// After the NVIDIA Container Toolkit's own NRI plugin (nvidia-ctk-installer, index 10).
	// The hook runs after the toolkit's hooks of CDI devices the CRI request names (containerd
	// applies those before NRI); the toolkit's hooks of a device NVIDIA's plugin adds run after
	// it (containerd resolves an adjustment's CDI devices after appending its hooks), and the
	// hook's ld.so drop-in, sorting first, keeps its decision through their update-ldcache.
	defaultIdx = "90"

	annotationPrefix  = "compat-hook/"
	annotationDisable = "compat-hook/disable"
	cdiAnnotation     = "cdi.k8s.io/"
	// NVIDIA's own NRI plugin injects the CDI devices this annotation names (nvidia.cdi.k8s.io/container.<name>).
	nvidiaCDIAnnotation = "nvidia.cdi.k8s.io/"
	// The same, as NVIDIA's plugin reads it from the pod (nri's GetEffectiveAnnotation: /container.<name>, /pod, bare).
	nvidiaCDIDomain = "nvidia.cdi.k8s.io"
)

// config is the document `compat-hook install` renders: a hooks.d document (oci-hooks(5)) plus
// the log file the plugin's own trace goes to.
type config struct {
	Version string   `json:"version"`
	Hook    *hook    `json:"hook"`
	Stages  []string `json:"stages"`
	LogFile string   `json:"log_file"`
}

type hook struct {
	Path    string   `json:"path"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	Timeout *int     `json:"timeout"`
}

func parseConfig(text []byte) (*config, error) {
	var c config
	if err := json.Unmarshal(text, &c); err != nil {
		return nil, fmt.Errorf("not a JSON document: %w", err)
	}
	if c.Hook == nil || !strings.HasPrefix(c.Hook.Path, "/") || len(c.Hook.Args) == 0 {
		return nil, errors.New("no hook with an absolute path and args")
	}
	if len(c.Stages) == 0 {
		c.Stages = []string{"createContainer"}
	}
	for _, s := range c.Stages {
		if s != "createContainer" {
			return nil, fmt.Errorf("stage %q: only createContainer is supported", s)
		}
	}
	return &c, nil
}

type plugin struct {
	configFile    string
	mu            sync.Mutex
	cfg           *config
	logFile       string
	logFromConfig bool
}

func (p *plugin) Configure(_ context.Context, text, runtime, version string) (api.EventMask, error) {
	var raw []byte
	if strings.TrimSpace(text) != "" {
		raw = []byte(text)
	} else if p.configFile != "" {
		b, err := os.ReadFile(p.configFile)
		if err != nil {
			return 0, fmt.Errorf("compat-hook-nri: %w", err)
		}
		raw = b
	} else {
		return 0, errors.New("compat-hook-nri: no configuration (none from the runtime, no -config)")
	}
	cfg, err := parseConfig(raw)
	if err != nil {
		return 0, fmt.Errorf("compat-hook-nri: configuration: %w", err)
	}
	p.mu.Lock()
	p.cfg = cfg
	if p.logFile == "" || p.logFromConfig {
		// -log-file wins over the configuration's log_file.
		p.logFile, p.logFromConfig = cfg.LogFile, true
	}
	p.mu.Unlock()
	fmt.Fprintf(os.Stderr, "compat-hook-nri: connected to %s %s\n", runtime, version)
	// CreateContainer only: no other event is worth a round trip.
	return api.MustParseEventMask("CreateContainer"), nil
}

// gpuReason says why a container of pod asks for a GPU ("" when it does not). The hook decides
// again from the spec; this only keeps non-GPU containers free of it. The cluster agent predicts
// these rules from the pod spec (compat_hook/cluster/workload/runs.py); testdata/routing-cases.json
// is the one table both are tested against (routing_test.go, tests/test_runs.py).
func gpuReason(pod *api.PodSandbox, c *api.Container) string {
	for _, d := range c.GetCDIDevices() {
		if strings.Contains(d.GetName(), "nvidia.com/") {
			return "CDI device " + d.GetName()
		}
	}
	for k, v := range c.GetAnnotations() {
		if (strings.HasPrefix(k, cdiAnnotation) || strings.HasPrefix(k, nvidiaCDIAnnotation)) &&
			strings.Contains(v, "nvidia.com/") {
			return "annotation " + k
		}
	}
	// NVIDIA's own NRI plugin (the GPU Operator's NRI mode) reads its annotation on the pod (the
	// kubelet passes pod annotations with the sandbox, never with a container) and the CDI device
	// it adds is resolved after every plugin answered: not in this request, the annotation is the
	// only sign of it.
	if v, ok := nriplugin.GetEffectiveAnnotation(pod, nvidiaCDIDomain, c.GetName()); ok && strings.Contains(v, "nvidia.com/") {
		return "pod annotation " + nvidiaCDIDomain + " (" + v + ")"
	}
	// A pod's CDI annotation: the engines that pass it on (CRI-O; containerd where its runtime's
	// pod_annotations lists it) give its devices to every container. The agent counts it too
	// (compat_hook/cluster/workload/runs.py); a container that gets no device from it costs one
	// hook's skip, never a container left out.
	for _, k := range sortedKeys(pod.GetAnnotations()) {
		if strings.HasPrefix(k, cdiAnnotation) && strings.Contains(pod.GetAnnotations()[k], "nvidia.com/") {
			return "pod annotation " + k
		}
	}
	// The last entry wins, as in execve: a CDI spec's NVIDIA_VISIBLE_DEVICES=void overrides the image's "all".
	visible, set := "", false
	for _, e := range c.GetEnv() {
		if v, ok := strings.CutPrefix(e, "NVIDIA_VISIBLE_DEVICES="); ok {
			visible, set = strings.TrimSpace(v), true
		}
	}
	if set && visible != "" && visible != "void" && visible != "none" {
		return "NVIDIA_VISIBLE_DEVICES=" + visible
	}
	// CDI edits the engine applied before NRI (containerd's CRI: CDI first, then NRI) leave
	// NVIDIA's device nodes in the spec.
	for _, d := range c.GetLinux().GetDevices() {
		if nvidiaDevice(d.GetPath()) {
			return "device " + d.GetPath()
		}
	}
	return ""
}

func nvidiaDevice(path string) bool {
	switch path {
	case "/dev/nvidiactl", "/dev/nvgpu", "/dev/nvidia-uvm":
		return true
	}
	tail, ok := strings.CutPrefix(path, "/dev/nvidia")
	if !ok || tail == "" {
		return false
	}
	for _, r := range tail {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// podSwitches: the pod's compat-hook/* annotations the container does not carry itself. The hook
// reads the container's annotations, and containerd copies a pod's there only where its runtime's
// pod_annotations lists them; the plugin sees every pod annotation, so it hands these on.
func podSwitches(pod *api.PodSandbox, c *api.Container) map[string]string {
	out := map[string]string{}
	own := c.GetAnnotations()
	for k, v := range pod.GetAnnotations() {
		if strings.HasPrefix(k, annotationPrefix) {
			if _, set := own[k]; !set {
				out[k] = v
			}
		}
	}
	return out
}

// disabled: compat-hook/disable on the container, else on its pod (the container's own wins).
func disabled(pod *api.PodSandbox, c *api.Container) bool {
	if v, ok := c.GetAnnotations()[annotationDisable]; ok {
		return truthy(v)
	}
	return truthy(pod.GetAnnotations()[annotationDisable])
}

func truthy(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on", "y":
		return true
	}
	return false
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	if disabled(pod, c) || gpuReason(pod, c) == "" {
		return nil, nil, nil
	}
	p.mu.Lock()
	cfg := p.cfg
	p.mu.Unlock()
	if cfg == nil {
		return nil, nil, nil
	}
	// The same entry twice (a pod that also names compat-hook's RuntimeClass) would run the hook twice.
	if hasHook(c, cfg) {
		return nil, nil, nil
	}
	h := &api.Hook{Path: cfg.Hook.Path, Args: cfg.Hook.Args, Env: cfg.Hook.Env}
	if cfg.Hook.Timeout != nil {
		h.Timeout = api.Int(*cfg.Hook.Timeout)
	}
	adj := &api.ContainerAdjustment{}
	adj.AddHooks(&api.Hooks{CreateContainer: []*api.Hook{h}})
	for k, v := range podSwitches(pod, c) {
		adj.AddAnnotation(k, v)
	}
	return adj, nil, nil
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Synchronize runs at each (re)connection with the containers the engine runs. A running container
// that asks for a GPU, started after this plugin was installed, lacks compat-hook's hook in its
// spec and has no line in compat-hook's log (a container the runtime wrapper routed has one) was
// created while the plugin was not connected (killed, crashed, not yet started): the engine went
// on without it (fail-open). Each such container gets one fail_open line in compat-hook's log,
// the shape the hook's and the wrapper's own fail_open lines have, so `compat-hook report`
// counts it as a failure.
func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, containers []*api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	cfg, logFile := p.cfg, p.logFile
	p.mu.Unlock()
	if cfg == nil || logFile == "" {
		return nil, nil
	}
	since := installedAt()
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	seen := loggedIDs(logFile)
	for _, c := range containers {
		pod := byID[c.GetPodSandboxId()]
		if startedAt(c) <= since || seen[c.GetId()] || disabled(pod, c) {
			continue
		}
		reason := gpuReason(pod, c)
		if reason == "" || hasHook(c, cfg) {
			continue
		}
		rec := map[string]any{"event": "fail_open", "decision": "error", "reason": "nri_plugin_missing",
			"component": "nri", "container_id": c.GetId(), "container_name": c.GetName(), "gpu": reason,
			"error": "created while compat-hook's NRI plugin was not connected: it runs without compat-hook"}
		if pod != nil {
			rec["pod"], rec["namespace"] = pod.GetName(), pod.GetNamespace()
		}
		appendLine(logFile, rec)
	}
	return nil, nil
}

// installedAt is when this plugin's binary was put in place (its mtime, ns): containers created
// before it were never the plugin's to route.
func installedAt() int64 {
	exe, err := os.Executable()
	if err != nil {
		return 0
	}
	st, err := os.Stat(exe)
	if err != nil {
		return 0
	}
	return st.ModTime().UnixNano()
}

// startedAt: the container's creation time (ns), or its process's start (containerd 2.1 leaves
// CreatedAt unset; the plugin shares the host's pid namespace), 0 when neither is known.
func startedAt(c *api.Container) int64 {
	if t := c.GetCreatedAt(); t > 0 {
		return t
	}
	if pid := c.GetPid(); pid > 0 {
		return processStart(pid)
	}
	return 0
}

// processStart: a process's start time (ns since the epoch) from /proc/<pid>/stat's starttime
// (clock ticks since boot; USER_HZ is 100 on Linux) and /proc/stat's btime; 0 when unreadable.
func processStart(pid uint32) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0
	}
	ticks, err := strconv.ParseInt(fields[19], 10, 64) // field 22 of stat(5); fields[0] is field 3
	if err != nil {
		return 0
	}
	st, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0
			}
			return boot*int64(time.Second) + ticks*int64(time.Second)/100
		}
	}
	return 0
}

// loggedIDs: the containers the log's last MiB has a line for (a decision of the hook or the
// wrapper, or this plugin's own fail_open line: an engine restart synchronizes the same containers again).
func loggedIDs(path string) map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > 1<<20 {
		_, _ = f.Seek(st.Size()-1<<20, 0)
	}
	b := make([]byte, 1<<20)
	n, _ := io.ReadFull(f, b)
	for _, line := range strings.Split(string(b[:n]), "\n") {
		if !strings.Contains(line, `"container_id"`) {
			continue
		}
		var r struct {
			ID string `json:"container_id"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.ID != "" {
			out[r.ID] = true
		}
	}
	return out
}

func hasHook(c *api.Container, cfg *config) bool {
	for _, h := range c.GetHooks().GetCreateContainer() {
		if h.GetPath() == cfg.Hook.Path && equal(h.GetArgs(), cfg.Hook.Args) {
			return true
		}
	}
	return false
}

func appendLine(path string, rec map[string]any) {
	rec["time"] = time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
	rec["pid"] = os.Getpid()
	b, _ := json.Marshal(rec)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o640)
	if err != nil {
		return
	}
	_, _ = f.Write(append(b, '\n'))
	_ = f.Close()
}

func newStub(p *plugin, name, idx, socket string, preRegistered bool, onClose func()) (stub.Stub, error) {
	opts := []stub.Option{stub.WithOnClose(onClose)}
	if !preRegistered {
		// A pre-registered plugin's name and index come from the engine (NRI_PLUGIN_NAME/IDX, its
		// file name); the stub takes them from there and refuses them twice.
		opts = append(opts, stub.WithPluginName(name), stub.WithPluginIdx(idx), stub.WithSocketPath(socket))
	}
	return stub.New(p, opts...)
}

func main() {
	name := flag.String("name", "", "plugin name (default: NRI_PLUGIN_NAME from the engine, else "+defaultName+")")
	idx := flag.String("idx", "", "plugin index (default: NRI_PLUGIN_IDX from the engine, else "+defaultIdx+")")
	socket := flag.String("socket", api.DefaultSocketPath, "the engine's NRI socket (external plugin)")
	cfgFile := flag.String("config", "", "the configuration compat-hook install rendered (when the engine hands over none)")
	logFile := flag.String("log-file", "", "compat-hook's log for the plugin's trace (default: the configuration's log_file)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "compat-hook-nri: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	pick := func(v, env, def string) string {
		if v != "" {
			return v
		}
		if e := os.Getenv(env); e != "" {
			return e
		}
		return def
	}
	*name = pick(*name, api.PluginNameEnvVar, defaultName)
	*idx = pick(*idx, api.PluginIdxEnvVar, defaultIdx)
	p := &plugin{configFile: *cfgFile, logFile: *logFile}
	if *cfgFile != "" {
		// Read once up front so a bad file is a one-line error at start, not a silent retry loop.
		b, err := os.ReadFile(*cfgFile)
		if err == nil {
			_, err = parseConfig(b)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "compat-hook-nri: -config %s: %v\n", *cfgFile, err)
			os.Exit(2)
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	preRegistered := os.Getenv(api.PluginSocketEnvVar) != ""
	backoff := 250 * time.Millisecond
	for {
		closed := make(chan struct{})
		var once sync.Once
		s, err := newStub(p, *name, *idx, *socket, preRegistered, func() { once.Do(func() { close(closed) }) })
		if err != nil {
			fmt.Fprintf(os.Stderr, "compat-hook-nri: %v\n", err)
			os.Exit(1)
		}
		err = s.Start(ctx)
		if err == nil {
			backoff = 250 * time.Millisecond
			select {
			case <-closed:
				err = errors.New("the engine closed the NRI connection")
			case <-ctx.Done():
				err = errors.New("compat-hook-nri stopped")
			}
			s.Stop()
			fmt.Fprintf(os.Stderr, "compat-hook-nri: %v\n", err)
		}
		if ctx.Err() != nil {
			return
		}
		if preRegistered {
			// The engine starts a pre-registered plugin again at its next start.
			os.Exit(1)
		}
		// External: the engine restarts; connect again (jittered, capped backoff).
		wait := backoff/2 + time.Duration(rand.Int63n(int64(backoff)))
		if backoff < 5*time.Second {
			backoff *= 2
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
}
