package deploy

import (
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
)

// TestGRPCProxyTier checks the etcd gRPC proxy tier (kubernetes/etcd-grpc-proxy.yaml): a Deployment
// running `etcd grpc-proxy start` and a Service in front of it whose address is the one the file tells
// the agents to use; the proxy serves TLS and admits only clients with a certificate of Calico's etcd
// CA (it forwards their requests with its own etcd credentials); its ports, probes and metrics
// annotation agree; it writes only to a scratch volume.
func TestGRPCProxyTier(t *testing.T) {
	const file = "kubernetes/etcd-grpc-proxy.yaml"
	var deploy, svc map[string]any
	for _, doc := range k8sDocuments(t, file) {
		switch doc["kind"] {
		case "Deployment":
			deploy = doc
		case "Service":
			svc = doc
		default:
			t.Errorf("%s: unexpected %v", file, doc["kind"])
		}
	}
	if deploy == nil || svc == nil {
		t.Fatalf("%s: want a Deployment and a Service", file)
	}
	spec := at(deploy, "spec", "template", "spec")
	containers := list(at(spec, "containers"))
	if len(containers) != 1 {
		t.Fatalf("%d containers, want 1", len(containers))
	}
	c := containers[0]
	args := map[string]string{}
	var words []string
	for _, a := range list(at(c, "args")) {
		s, _ := a.(string)
		if k, v, ok := strings.Cut(s, "="); ok && strings.HasPrefix(k, "--") {
			args[k[2:]] = v
		} else {
			words = append(words, s)
		}
	}
	if cmd := list(at(c, "command")); len(cmd) != 1 || !strings.HasSuffix(cmd[0].(string), "/etcd") ||
		strings.Join(words, " ") != "grpc-proxy start" {
		t.Errorf("command %v args %v: want etcd grpc-proxy start", cmd, words)
	}
	for _, k := range []string{"endpoints", "cacert", "cert", "key", "cert-file", "key-file", "trusted-ca-file"} {
		if args[k] == "" {
			t.Errorf("--%s is not set: the proxy must reach etcd and serve its clients over TLS with client certificates", k)
		}
	}
	for _, e := range strings.Split(args["endpoints"], ",") {
		if !strings.HasPrefix(e, "https://") {
			t.Errorf("--endpoints %s: etcd is reached over TLS", e)
		}
	}

	ports := map[string]string{} // container port name -> number
	for _, p := range list(at(c, "ports")) {
		ports[at(p, "name").(string)] = fmt.Sprint(at(p, "containerPort"))
	}
	portOf := func(flag string) string {
		t.Helper()
		v := strings.TrimPrefix(strings.TrimPrefix(args[flag], "http://"), "https://")
		_, port, err := net.SplitHostPort(v)
		if err != nil {
			t.Errorf("--%s=%s: %v", flag, args[flag], err)
		}
		return port
	}
	if p := portOf("listen-addr"); p != ports["client"] {
		t.Errorf("--listen-addr port %s, container port client %s", p, ports["client"])
	}
	if p := portOf("metrics-addr"); p != ports["metrics"] {
		t.Errorf("--metrics-addr port %s, container port metrics %s", p, ports["metrics"])
	}
	if a := at(deploy, "spec", "template", "metadata", "annotations", "prometheus.io/port"); fmt.Sprint(a) != ports["metrics"] {
		t.Errorf("prometheus.io/port %v, metrics port %s", a, ports["metrics"])
	}
	if at(c, "readinessProbe", "httpGet", "port") != "metrics" || at(c, "readinessProbe", "httpGet", "path") != "/health" {
		t.Errorf("readinessProbe %v: want /health on the metrics port", at(c, "readinessProbe"))
	}

	// Every file the flags name is in a mounted Secret; the data directory is on a writable scratch volume.
	mounts := map[string]string{} // mount path -> volume name
	for _, m := range list(at(c, "volumeMounts")) {
		mounts[at(m, "mountPath").(string)] = at(m, "name").(string)
	}
	volumes := map[string]any{}
	for _, v := range list(at(spec, "volumes")) {
		volumes[at(v, "name").(string)] = v
	}
	volumeOf := func(path string) any {
		for dir, name := range mounts {
			if strings.HasPrefix(path, dir+"/") {
				return volumes[name]
			}
		}
		return nil
	}
	for _, k := range []string{"cacert", "cert", "key", "cert-file", "key-file", "trusted-ca-file"} {
		if v := volumeOf(args[k]); at(v, "secret", "secretName") == nil {
			t.Errorf("--%s=%s is not in a mounted Secret", k, args[k])
		}
	}
	if args["trusted-ca-file"] != args["cacert"] {
		t.Errorf("--trusted-ca-file %s differs from --cacert %s: the agents' certificates are signed by Calico's etcd CA", args["trusted-ca-file"], args["cacert"])
	}
	if at(c, "securityContext", "readOnlyRootFilesystem") != true {
		t.Errorf("readOnlyRootFilesystem is not true")
	}
	if v := volumeOf(args["data-dir"]); v == nil || at(v, "emptyDir") == nil {
		t.Errorf("--data-dir %s is not on an emptyDir volume", args["data-dir"])
	}

	// The Service selects the pods, exposes the client port, and is the address the file gives the agents.
	if sel := at(svc, "spec", "selector"); sel == nil || !reflect.DeepEqual(sel, at(deploy, "spec", "template", "metadata", "labels")) {
		t.Errorf("Service selector %v does not match the pod labels %v", at(svc, "spec", "selector"), at(deploy, "spec", "template", "metadata", "labels"))
	}
	svcPorts := list(at(svc, "spec", "ports"))
	if len(svcPorts) != 1 || at(svcPorts[0], "targetPort") != "client" {
		t.Fatalf("Service ports %v: want one, to the client port", svcPorts)
	}
	addr := net.JoinHostPort(at(svc, "metadata", "name").(string)+"."+at(svc, "metadata", "namespace").(string)+".svc",
		fmt.Sprint(at(svcPorts[0], "port")))
	if args["advertise-client-url"] != addr {
		t.Errorf("--advertise-client-url %s, the Service is %s", args["advertise-client-url"], addr)
	}
	if text := string(readFile(t, file)); !strings.Contains(text, "value: https://"+addr) {
		t.Errorf("%s does not tell the agents to use https://%s", file, addr)
	}
}
