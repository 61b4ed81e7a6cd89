// Package kubernetes_test checks the manifests of deploy/kubernetes: they decode strictly into
// the Kubernetes API types, they pass only flags and variables the wordcount binary has, and
// the addresses, the ports and the names agree.
package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// manifests are the objects of every *.yaml file here, decoded strictly.
type manifests struct {
	namespaces   []*corev1.Namespace
	services     []*corev1.Service
	secrets      []*corev1.Secret
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
}

// decode reads every document of every *.yaml file into its API type: an unknown kind, an
// unknown field or a value of the wrong type fails the test.
func decode(t *testing.T) manifests {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var m manifests
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s, document %d: %v", file, i, err)
			}
			if string(js) == "null" {
				continue // an empty document
			}
			var tm metav1.TypeMeta
			if err := json.Unmarshal(js, &tm); err != nil {
				t.Fatalf("%s, document %d: %v", file, i, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 Namespace":
				o := &corev1.Namespace{}
				m.namespaces, obj = append(m.namespaces, o), o
			case "v1 Service":
				o := &corev1.Service{}
				m.services, obj = append(m.services, o), o
			case "v1 Secret":
				o := &corev1.Secret{}
				m.secrets, obj = append(m.secrets, o), o
			case "apps/v1 StatefulSet":
				o := &appsv1.StatefulSet{}
				m.statefulSets, obj = append(m.statefulSets, o), o
			case "apps/v1 Deployment":
				o := &appsv1.Deployment{}
				m.deployments, obj = append(m.deployments, o), o
			default:
				t.Fatalf("%s, document %d: unexpected apiVersion %q kind %q", file, i, tm.APIVersion, tm.Kind)
			}
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			if err := dec.Decode(obj); err != nil {
				t.Fatalf("%s, document %d (%s): %v", file, i, tm.Kind, err)
			}
		}
	}
	return m
}

// usage is what the wordcount binary's -help lists: its flags and the variables that set them.
type usage struct{ flags, env map[string]bool }

func wordcountUsage(t *testing.T) (bin string, u usage) {
	t.Helper()
	bin = filepath.Join(t.TempDir(), "wordcount")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/epochflow/epochflow/examples/wordcount").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-help").CombinedOutput()
	if err != nil {
		t.Fatalf("wordcount -help: %v\n%s", err, out)
	}
	u = usage{flags: map[string]bool{}, env: map[string]bool{}}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		u.flags[m[1]] = true
	}
	for _, m := range regexp.MustCompile(`\(env (EPOCHFLOW_[A-Z0-9_]+)`).FindAllStringSubmatch(string(out), -1) {
		u.env[m[1]] = true
	}
	if !u.flags["addresses"] || !u.env["EPOCHFLOW_ADDRESSES"] || !u.flags["input"] {
		t.Fatalf("could not read the flags and variables of wordcount -help:\n%s", out)
	}
	return bin, u
}

func TestManifests(t *testing.T) {
	m := decode(t)
	if len(m.statefulSets) != 1 || len(m.secrets) != 1 || len(m.namespaces) != 1 {
		t.Fatalf("want one StatefulSet, one Secret and one Namespace, have %d, %d, %d",
			len(m.statefulSets), len(m.secrets), len(m.namespaces))
	}
	sts, secret, ns := m.statefulSets[0], m.secrets[0], m.namespaces[0].Name
	var svc *corev1.Service
	for _, s := range m.services {
		if s.Name == sts.Spec.ServiceName {
			svc = s
		}
	}
	if svc == nil {
		t.Fatalf("no Service named %q, the StatefulSet's serviceName", sts.Spec.ServiceName)
	}
	for _, o := range []metav1.Object{sts, secret, svc} {
		if o.GetNamespace() != ns {
			t.Errorf("%s is in namespace %q, want %q", o.GetName(), o.GetNamespace(), ns)
		}
	}

	// The headless Service, publishing the pods' names before they are ready (they become ready
	// only once they reach each other), selects the StatefulSet's pods.
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: want clusterIP None and publishNotReadyAddresses", svc.Name)
	}
	labels := sts.Spec.Template.Labels
	for k, v := range svc.Spec.Selector {
		if labels[k] != v {
			t.Errorf("Service %s selects %s=%s, which the pods do not have", svc.Name, k, v)
		}
	}
	sel, err := metav1.LabelSelectorAsMap(sts.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("the StatefulSet selects %s=%s, which its pods do not have", k, v)
		}
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q, want Parallel: the processes wait for each other", sts.Spec.PodManagementPolicy)
	}
	if len(sts.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want one container, have %d", len(sts.Spec.Template.Spec.Containers))
	}
	c := sts.Spec.Template.Spec.Containers[0]

	// Every flag and variable passed exists in the binary.
	bin, u := wordcountUsage(t)
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
		if strings.HasPrefix(e.Name, "EPOCHFLOW_") && !u.env[e.Name] {
			t.Errorf("the container sets %s, which wordcount does not read", e.Name)
		}
	}
	args := map[string]string{}
	for i := 0; i < len(c.Args); i++ {
		a := c.Args[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !u.flags[name] {
			t.Errorf("argument %q is not a flag of wordcount", a)
			continue
		}
		if !hasValue && i+1 < len(c.Args) && !strings.HasPrefix(c.Args[i+1], "-") {
			value = c.Args[i+1]
			i++
		}
		args[name] = value
		for _, ref := range regexp.MustCompile(`\$\(([A-Za-z0-9_]+)\)`).FindAllStringSubmatch(value, -1) {
			if _, ok := env[ref[1]]; !ok {
				t.Errorf("argument -%s %s refers to %s, which the container does not set", name, value, ref[1])
			}
		}
	}
	// The setting of a flag: the argument, or else its variable's value (or reference).
	setting := func(flag, variable string) (string, *corev1.EnvVarSource) {
		if v, ok := args[flag]; ok {
			return v, nil
		}
		e := env[variable]
		return e.Value, e.ValueFrom
	}

	// The process id is the pod's name (flow-N gives N).
	id, idFrom := setting("process-id", "EPOCHFLOW_PROCESS_ID")
	if m := regexp.MustCompile(`^\$\(([A-Za-z0-9_]+)\)$`).FindStringSubmatch(id); m != nil {
		idFrom = env[m[1]].ValueFrom
	}
	if idFrom == nil || idFrom.FieldRef == nil || idFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("the process id (%q) is not the pod's name from the downward API", id)
	}

	// The secret and the store come from the Secret, with keys it has.
	for _, v := range []struct{ flag, env string }{{"cluster-secret", "EPOCHFLOW_CLUSTER_SECRET"}, {"recovery", "EPOCHFLOW_RECOVERY"}} {
		_, from := setting(v.flag, v.env)
		if from == nil || from.SecretKeyRef == nil {
			t.Errorf("%s does not come from a Secret", v.env)
			continue
		}
		ref := from.SecretKeyRef
		if _, ok := secret.StringData[ref.Key]; ref.Name != secret.Name || !ok {
			t.Errorf("%s comes from key %q of Secret %q, which %s does not hold", v.env, ref.Key, ref.Name, secret.Name)
		}
	}
	if !strings.HasPrefix(secret.StringData[env["EPOCHFLOW_RECOVERY"].ValueFrom.SecretKeyRef.Key], "postgres://") {
		t.Errorf("the recovery store in the Secret is not a postgres:// URL")
	}

	// The addresses: one per replica, the pods' names under the Service, on the port that the
	// container and the Service open.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	addrs, _ := setting("addresses", "EPOCHFLOW_ADDRESSES")
	list := strings.Split(addrs, ",")
	if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != len(list) {
		t.Errorf("-addresses lists %d processes, the StatefulSet has %v replicas", len(list), sts.Spec.Replicas)
	}
	for i, a := range list {
		want := fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local:%d", sts.Name, i, svc.Name, ns, ports["cluster"])
		if a != want {
			t.Errorf("address %d is %q, want %q (pod %s-%d, Service %s, container port %d)", i, a, want, sts.Name, i, svc.Name, ports["cluster"])
		}
	}
	servicePort := func(name string) (int32, string) {
		for _, p := range svc.Spec.Ports {
			if p.Name == name {
				return p.Port, p.TargetPort.String()
			}
		}
		return 0, ""
	}
	if p, target := servicePort("cluster"); p != ports["cluster"] || (target != "cluster" && target != strconv.Itoa(int(ports["cluster"]))) {
		t.Errorf("the Service's cluster port %d (target %s) is not the container's %d", p, target, ports["cluster"])
	}

	// The probes ask the metrics server, on its port, for /livez and /readyz.
	metrics, _ := setting("metrics-addr", "EPOCHFLOW_METRICS_ADDR")
	if _, port, _ := strings.Cut(metrics, ":"); port != strconv.Itoa(int(ports["metrics"])) {
		t.Errorf("-metrics-addr %q is not on the container's metrics port %d", metrics, ports["metrics"])
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/livez"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || (g.Port.String() != "metrics" && g.Port.IntValue() != int(ports["metrics"])) {
			t.Errorf("the %s probe asks %s on port %s, want %s on the metrics port", p.name, g.Path, g.Port.String(), p.path)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("the container requests no CPU or memory")
	}

	// The binary accepts the configuration as a pod would run it: the arguments with the pod's
	// variables expanded, the variables with the Secret's values. -graph stops after the checks
	// of the flags (it opens no store).
	pod := sts.Name + "-1"
	cmd := exec.Command(bin, "-graph")
	cmd.Env = append(os.Environ(), "POD_NAME="+pod)
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			v = secret.StringData[e.ValueFrom.SecretKeyRef.Key]
		}
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			v = pod
		}
		cmd.Env = append(cmd.Env, e.Name+"="+v)
	}
	for _, a := range c.Args {
		cmd.Args = append(cmd.Args, strings.ReplaceAll(a, "$(POD_NAME)", pod))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("wordcount %s with the manifest's variables: %v\n%s", strings.Join(cmd.Args[1:], " "), err, out)
	}
	if !slices.Contains(c.Args, "$(POD_NAME)") && env["EPOCHFLOW_PROCESS_ID"].ValueFrom == nil {
		t.Errorf("no process id from the pod name")
	}
}
