// Command upgrade-harness runs NVIDIA's own driver upgrade state machine
// (github.com/NVIDIA/k8s-operator-libs/pkg/upgrade, as the GPU Operator does)
// against an API server that has no controller-manager.
//
// Each round it plays the two controllers the test control plane lacks, then
// calls BuildState and ApplyState exactly as the GPU Operator's upgrade
// controller does:
//
//   - the operator: the driver DaemonSet's template follows the ClusterPolicy's
//     spec.driver.version, each template gets a ControllerRevision named
//     <daemonset>-<hash> (the newest revision number is the current one);
//   - the DaemonSet controller: every selected node without a live driver pod
//     gets one, labelled with the current controller-revision-hash, and the
//     DaemonSet's status counts them.
//
// With --daemonset-controller=false a real kube-controller-manager is there
// (tests/support/node.py): its DaemonSet controller makes the revisions and the
// pods, and the harness plays the operator's template update only.
//
// The upgrade policy is the ClusterPolicy's spec.driver.upgradePolicy.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr/funcr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/NVIDIA/k8s-operator-libs/api/upgrade/v1alpha1"
	"github.com/NVIDIA/k8s-operator-libs/pkg/upgrade"
)

const (
	dsName      = "nvidia-driver-daemonset"
	appLabel    = "app"
	versionAnno = "nvidia.com/driver-version"
)

var clusterPolicyGVR = schema.GroupVersionResource{Group: "nvidia.com", Version: "v1", Resource: "clusterpolicies"}

type harness struct {
	ns string
	// playDS: the harness plays the DaemonSet controller (no kube-controller-manager)
	playDS bool
	kube   kubernetes.Interface
	dyn    dynamic.Interface
	state  upgrade.ClusterUpgradeStateManager
}

func hashOf(version string) string {
	sum := sha256.Sum256([]byte(version))
	return hex.EncodeToString(sum[:])[:10]
}

// clusterPolicy returns spec.driver.version and spec.driver.upgradePolicy of the first ClusterPolicy.
func (h *harness) clusterPolicy(ctx context.Context) (string, *v1alpha1.DriverUpgradePolicySpec, error) {
	list, err := h.dyn.Resource(clusterPolicyGVR).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) == 0 {
		return "", nil, fmt.Errorf("no ClusterPolicy: %v", err)
	}
	obj := list.Items[0].Object
	version, _, _ := unstructured.NestedString(obj, "spec", "driver", "version")
	raw, found, _ := unstructured.NestedMap(obj, "spec", "driver", "upgradePolicy")
	policy := &v1alpha1.DriverUpgradePolicySpec{}
	if found {
		b, _ := json.Marshal(raw)
		if err := json.Unmarshal(b, policy); err != nil {
			return "", nil, err
		}
	}
	return version, policy, nil
}

// playOperator keeps the driver DaemonSet's template and ControllerRevisions on the ClusterPolicy's version.
func (h *harness) playOperator(ctx context.Context, version string) (*appsv1.DaemonSet, string, error) {
	ds, err := h.kube.AppsV1().DaemonSets(h.ns).Get(ctx, dsName, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	hash := hashOf(version)
	if ds.Spec.Template.Annotations[versionAnno] != version {
		if ds.Spec.Template.Annotations == nil {
			ds.Spec.Template.Annotations = map[string]string{}
		}
		ds.Spec.Template.Annotations[versionAnno] = version
		if ds, err = h.kube.AppsV1().DaemonSets(h.ns).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
			return nil, "", err
		}
	}
	if !h.playDS { // the real DaemonSet controller names and numbers the revisions
		return ds, "", nil
	}
	revs, err := h.kube.AppsV1().ControllerRevisions(h.ns).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(ds.Spec.Selector.MatchLabels).String()})
	if err != nil {
		return nil, "", err
	}
	var max int64
	var mine *appsv1.ControllerRevision
	for i := range revs.Items {
		r := &revs.Items[i]
		if r.Revision > max {
			max = r.Revision
		}
		if r.Name == dsName+"-"+hash {
			mine = r
		}
	}
	switch {
	case mine == nil:
		tmpl, _ := json.Marshal(map[string]string{"version": version})
		_, err = h.kube.AppsV1().ControllerRevisions(h.ns).Create(ctx, &appsv1.ControllerRevision{
			ObjectMeta: metav1.ObjectMeta{Name: dsName + "-" + hash, Namespace: h.ns,
				Labels: ds.Spec.Selector.MatchLabels,
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds,
					appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
			Data: runtime.RawExtension{Raw: tmpl}, Revision: max + 1}, metav1.CreateOptions{})
	case mine.Revision < max: // a rollback: the old revision becomes the newest again
		mine.Revision = max + 1
		_, err = h.kube.AppsV1().ControllerRevisions(h.ns).Update(ctx, mine, metav1.UpdateOptions{})
	}
	return ds, hash, err
}

// playDaemonSetController gives every selected node a driver pod and keeps the DaemonSet's status counts.
func (h *harness) playDaemonSetController(ctx context.Context, ds *appsv1.DaemonSet, hash, version string) error {
	nodes, err := h.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(ds.Spec.Template.Spec.NodeSelector).String()})
	if err != nil {
		return err
	}
	pods, err := h.kube.CoreV1().Pods(h.ns).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(ds.Spec.Selector.MatchLabels).String()})
	if err != nil {
		return err
	}
	has := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			has[p.Spec.NodeName] = true
		}
	}
	for _, n := range nodes.Items {
		if has[n.Name] {
			continue
		}
		lbl := map[string]string{"controller-revision-hash": hash}
		for k, v := range ds.Spec.Template.Labels {
			lbl[k] = v
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: dsName + "-", Namespace: h.ns, Labels: lbl,
				Annotations: map[string]string{versionAnno: version},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds,
					appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
			Spec: *ds.Spec.Template.Spec.DeepCopy(),
		}
		pod.Spec.NodeName = n.Name
		pod.Spec.NodeSelector = nil
		if _, err := h.kube.CoreV1().Pods(h.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	ds.Status.DesiredNumberScheduled = int32(len(nodes.Items))
	ds.Status.CurrentNumberScheduled = int32(len(nodes.Items))
	ds.Status.NumberReady = int32(len(nodes.Items))
	_, err = h.kube.AppsV1().DaemonSets(h.ns).UpdateStatus(ctx, ds, metav1.UpdateOptions{})
	return err
}

func (h *harness) round(ctx context.Context) error {
	version, policy, err := h.clusterPolicy(ctx)
	if err != nil {
		return err
	}
	ds, hash, err := h.playOperator(ctx, version)
	if err != nil {
		return fmt.Errorf("operator: %w", err)
	}
	if h.playDS {
		if err := h.playDaemonSetController(ctx, ds, hash, version); err != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("daemonset controller: %w", err)
		}
	}
	state, err := h.state.BuildState(ctx, h.ns, ds.Spec.Selector.MatchLabels)
	if err != nil {
		return fmt.Errorf("BuildState: %w", err)
	}
	if err := h.state.ApplyState(ctx, state, policy); err != nil {
		return fmt.Errorf("ApplyState: %w", err)
	}
	return nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	ns := flag.String("namespace", "gpu-operator", "namespace of the driver DaemonSet")
	interval := flag.Duration("interval", time.Second, "time between rounds")
	rounds := flag.Int("rounds", 0, "stop after this many rounds (0: run until killed)")
	verbosity := flag.Int("v", 0, "log verbosity")
	// The GPU Operator passes "app=nvidia-operator-validator" (controllers/upgrade_controller.go): a node
	// leaves validation-required only once every such pod on it is Ready.
	validation := flag.String("validation", "", "pod selector of the validation state (empty: no validation state)")
	playDS := flag.Bool("daemonset-controller", true,
		"play the DaemonSet controller (false: a kube-controller-manager runs its own)")
	flag.Parse()

	// The GPU Operator's own call (cmd/gpu-operator/main.go): the keys become nvidia.com/gpu-driver-upgrade-*.
	upgrade.SetDriverName("gpu")

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "upgrade-harness:", err)
		os.Exit(1)
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) },
		funcr.Options{Verbosity: *verbosity})
	kube := kubernetes.NewForConfigOrDie(cfg)
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "nvidia-gpu-operator"})
	mgr, err := upgrade.NewClusterUpgradeStateManager(log, cfg, recorder)
	if err != nil {
		fmt.Fprintln(os.Stderr, "upgrade-harness:", err)
		os.Exit(1)
	}
	if *validation != "" {
		mgr = mgr.WithValidationEnabled(*validation)
	}
	h := &harness{ns: *ns, playDS: *playDS, kube: kube, dyn: dynamic.NewForConfigOrDie(cfg), state: mgr}
	fmt.Println("keys", upgrade.GetUpgradeStateLabelKey(), upgrade.GetUpgradeSkipNodeLabelKey())
	for i := 1; *rounds == 0 || i <= *rounds; i++ {
		if err := h.round(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "round "+strconv.Itoa(i)+":", err)
		}
		time.Sleep(*interval)
	}
	broadcaster.Shutdown()
}
