package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// repoRoot is the module root, seen from this package's directory (go test runs tests there).
const repoRoot = ".."

// TestMain removes the agent binary that agentFlags builds once for all tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if agentBuild.dir != "" {
		os.RemoveAll(agentBuild.dir)
	}
	os.Exit(code)
}

// agentFlag is one flag of `vpp-route-agent --help` that has an environment fall-back.
type agentFlag struct {
	name  string // without the leading "--"
	env   string // the environment variable it falls back to
	def   string // the default as --help prints it, unquoted; "" when --help shows none
	hasDf bool   // --help printed a "(default ...)"
}

var agentBuild struct {
	once  sync.Once
	dir   string
	flags map[string]agentFlag // by environment variable
	help  string               // the whole --help text
	skip  string               // why the flags are unavailable, when they are
	err   error
}

// agentFlags builds ./cmd/vpp-route-agent and parses its --help. It skips the test when the command
// is not part of this tree yet (the deploy files are written before the agent is merged).
func agentFlags(t *testing.T) map[string]agentFlag {
	t.Helper()
	agentBuild.once.Do(func() {
		src := filepath.Join(repoRoot, "cmd", "vpp-route-agent")
		if _, err := os.Stat(filepath.Join(src, "main.go")); err != nil {
			agentBuild.skip = "cmd/vpp-route-agent is not in this tree yet: the env file and the DaemonSet " +
				"cannot be checked against the agent's flags until it is merged"
			return
		}
		dir, err := os.MkdirTemp("", "deploy-test-")
		if err != nil {
			agentBuild.err = err
			return
		}
		agentBuild.dir = dir
		bin := filepath.Join(dir, "vpp-route-agent")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		build := exec.CommandContext(ctx, goTool(), "build", "-o", bin, "./cmd/vpp-route-agent")
		build.Dir = repoRoot
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			agentBuild.err = fmt.Errorf("go build ./cmd/vpp-route-agent: %w\n%s", err, out)
			return
		}
		help := exec.CommandContext(ctx, bin, "--help")
		help.Env = []string{} // the help text must not depend on the caller's environment
		out, err := help.CombinedOutput()
		// --help exits 0 today; a non-zero exit is tolerated as long as the flags can be read.
		agentBuild.flags = parseHelp(string(out))
		agentBuild.help = string(out)
		if len(agentBuild.flags) == 0 {
			agentBuild.err = fmt.Errorf("vpp-route-agent --help (err %v) printed no flag with an (env NAME) annotation:\n%s", err, out)
		}
	})
	if agentBuild.skip != "" {
		t.Skip(agentBuild.skip)
	}
	if agentBuild.err != nil {
		t.Fatal(agentBuild.err)
	}
	return agentBuild.flags
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

var (
	helpFlagLine = regexp.MustCompile(`^\s+(?:-[A-Za-z0-9], )?--([a-z0-9][a-z0-9-]*)\b(.*)$`)
	helpEnv      = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)\)`)
	helpDefault  = regexp.MustCompile(`\(default (.*)\)\s*$`)
)

// parseHelp reads pflag's PrintDefaults lines: "  --flag-name type   usage (env NAME) (default X)".
// Flags without an "(env NAME)" (--help, --version) are left out.
func parseHelp(help string) map[string]agentFlag {
	flags := map[string]agentFlag{}
	for _, line := range strings.Split(help, "\n") {
		m := helpFlagLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		e := helpEnv.FindStringSubmatch(m[2])
		if e == nil {
			continue
		}
		f := agentFlag{name: m[1], env: e[1]}
		if d := helpDefault.FindStringSubmatch(m[2]); d != nil {
			f.def, f.hasDf = normalizeDefault(d[1]), true
		}
		flags[f.env] = f
	}
	return flags
}

// normalizeDefault turns pflag's rendering of a default into the environment variable's form:
// "text" -> text, [a,b] -> a,b.
func normalizeDefault(s string) string {
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		return s[1 : len(s)-1]
	}
	return s
}

// isAgentVariable reports whether name is in the agent's environment namespace: the agent must know
// every such variable that the deploy files mention.
func isAgentVariable(name string) bool {
	switch name {
	case "ETCD_ENDPOINTS", "ETCD_CA_CERT_FILE", "ETCD_CERT_FILE", "ETCD_KEY_FILE", "ETCD_USERNAME", "ETCD_PASSWORD", "NODENAME":
		return true
	}
	return strings.HasPrefix(name, "VPP_ROUTE_AGENT_")
}

// passwordVariable is the one agent variable that is no flag's: the etcd password (a flag would show it
// in the process list). --help names it in the usage of --etcd-username.
const passwordVariable = "ETCD_PASSWORD"

// agentVariableMention finds the agent's variables named anywhere in a text, prose included.
var agentVariableMention = regexp.MustCompile(`\b(VPP_ROUTE_AGENT_[A-Z0-9_]+|ETCD_[A-Z0-9_]+|NODENAME)\b`)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func glob(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no files match %s", pattern)
	}
	return files
}

// documentationPrefixes are the only addresses examples may use (RFC 5737, RFC 3849), besides
// loopback, the unspecified address and default routes.
var documentationPrefixes = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("2001:db8::/32"),
}

var addressCandidate = regexp.MustCompile(`\b\d{1,3}(?:\.\d{1,3}){3}\b|[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}`)

// checkExampleAddresses fails for an IP address in text that is not a documentation address.
func checkExampleAddresses(t *testing.T, file string, text []byte) {
	t.Helper()
	for _, c := range addressCandidate.FindAll(text, -1) {
		a, err := netip.ParseAddr(string(c))
		if err != nil {
			continue // a time of day, a MAC address, a port
		}
		// Loopback, unspecified and link-local addresses (the pods' gateway 169.254.1.1, fe80::1) are
		// fixed values, not examples of someone's network.
		if a.IsLoopback() || a.IsUnspecified() || a.IsLinkLocalUnicast() {
			continue
		}
		if !slices.ContainsFunc(documentationPrefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
			t.Errorf("%s: example address %s is not a documentation address (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32)", file, a)
		}
	}
}

// ---- systemd -------------------------------------------------------------------------------------

// unitFile is a parsed systemd unit: section -> key -> values in order (keys may repeat).
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, path)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
			continue
		case strings.HasSuffix(line, "\\"):
			t.Fatalf("%s:%d: line continuations are not used in this unit", path, n)
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			if u[section] != nil {
				t.Fatalf("%s:%d: section [%s] appears twice", path, n, section)
			}
			u[section] = map[string][]string{}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: not a key=value line in a section: %q", path, n, line)
		}
		k = strings.TrimSpace(k)
		u[section][k] = append(u[section][k], strings.TrimSpace(v))
	}
	return u
}

// last returns the effective value of a single-valued key (systemd: the last assignment wins).
func (u unitFile) last(section, key string) (string, bool) {
	vs := u[section][key]
	if len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// words returns the space-separated items of a list-valued key, all assignments joined.
func (u unitFile) words(section, key string) []string {
	var out []string
	for _, v := range u[section][key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

func TestSystemdUnit(t *testing.T) {
	const path = "systemd/vpp-route-agent.service"
	u := parseUnit(t, path)

	exact := []struct{ section, key, want string }{
		{"Service", "Type", "notify"},
		{"Service", "NotifyAccess", "main"},
		{"Service", "Restart", "always"},
		{"Service", "ExecStart", "/usr/local/bin/vpp-route-agent"}, // no flags: they come from the env file
		{"Service", "ExecReload", "/bin/kill -HUP $MAINPID"},
		{"Service", "EnvironmentFile", "/etc/default/vpp-route-agent"},
		{"Service", "User", "vpp-route-agent"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "CapabilityBoundingSet", ""},
		{"Service", "ProtectSystem", "strict"},
		{"Service", "ProtectHome", "yes"},
		{"Service", "PrivateTmp", "yes"},
		{"Service", "ProtectKernelTunables", "yes"},
		{"Service", "ProtectKernelModules", "yes"},
		{"Service", "ProtectKernelLogs", "yes"},
		{"Service", "ProtectControlGroups", "yes"},
		{"Service", "RestrictNamespaces", "yes"},
		{"Service", "LockPersonality", "yes"},
		{"Service", "MemoryDenyWriteExecute", "yes"},
		{"Service", "SystemCallArchitectures", "native"},
		{"Install", "WantedBy", "multi-user.target"},
	}
	for _, c := range exact {
		got, ok := u.last(c.section, c.key)
		if !ok || got != c.want {
			t.Errorf("[%s] %s = %q (set: %v), want %q", c.section, c.key, got, ok, c.want)
		}
	}
	for _, key := range []string{"WatchdogSec", "TimeoutStopSec", "TimeoutStartSec"} {
		v, ok := u.last("Service", key)
		if !ok || v == "" || v == "0" || v == "infinity" {
			t.Errorf("[Service] %s = %q: want a finite timeout", key, v)
		}
	}
	if v, _ := u.last("Service", "DynamicUser"); v != "" && v != "no" {
		t.Errorf("DynamicUser=%s: the unit runs as the static user vpp-route-agent (see the unit's comment)", v)
	}

	contains := []struct{ section, key, want string }{
		{"Unit", "After", "vpp.service"},
		{"Unit", "After", "network-online.target"},
		{"Unit", "Wants", "network-online.target"},
		{"Service", "SupplementaryGroups", "vpp"},
	}
	for _, c := range contains {
		if got := u.words(c.section, c.key); !slices.Contains(got, c.want) {
			t.Errorf("[%s] %s = %v, want it to contain %s", c.section, c.key, got, c.want)
		}
	}
	families := u.words("Service", "RestrictAddressFamilies")
	sort.Strings(families)
	if want := []string{"AF_INET", "AF_INET6", "AF_UNIX"}; !slices.Equal(families, want) {
		t.Errorf("RestrictAddressFamilies = %v, want %v (AF_UNIX: VPP socket and sd_notify)", families, want)
	}
	paths := func(key string) []string { // "-" marks a path that may be missing
		var out []string
		for _, p := range u.words("Service", key) {
			out = append(out, strings.TrimPrefix(p, "-"))
		}
		return out
	}
	if !slices.Contains(paths("ReadWritePaths"), "/run/vpp") {
		t.Errorf("ReadWritePaths = %v, want /run/vpp (the VPP API socket's directory)", paths("ReadWritePaths"))
	}
	if !slices.Contains(paths("ReadOnlyPaths"), "/var/lib/calico") {
		t.Errorf("ReadOnlyPaths = %v, want /var/lib/calico (nodename fall-back)", paths("ReadOnlyPaths"))
	}

	// The user the unit runs as is the one the sysusers.d file creates.
	user, _ := u.last("Service", "User")
	sysusers := string(readFile(t, "systemd/vpp-route-agent.sysusers"))
	if !regexp.MustCompile(`(?m)^u\s+` + regexp.QuoteMeta(user) + `\s`).MatchString(sysusers) {
		t.Errorf("systemd/vpp-route-agent.sysusers does not create the unit's user %q", user)
	}
}

// ---- environment file ----------------------------------------------------------------------------

var (
	envAssignment = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)
	envDocumented = regexp.MustCompile(`^#\s?([A-Z][A-Z0-9_]*)=(.*)$`)
)

// envFile is the parsed environment file.
type envFile struct {
	set        map[string]string   // uncommented NAME=value
	documented map[string][]string // commented "# NAME=value" lines: defaults and examples
}

func parseEnvFile(t *testing.T, path string) envFile {
	t.Helper()
	text := readFile(t, path)
	ef := envFile{set: map[string]string{}, documented: map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, "#"):
			if m := envDocumented.FindStringSubmatch(line); m != nil {
				ef.documented[m[1]] = append(ef.documented[m[1]], m[2])
			}
		default:
			m := envAssignment.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("%s:%d: neither a comment nor NAME=value: %q", path, n, line)
				continue
			}
			if strings.ContainsAny(m[2], " \t\"'$\\") {
				t.Errorf("%s:%d: keep values free of spaces, quotes, $ and \\ (systemd and shells read them differently): %q", path, n, line)
			}
			if _, dup := ef.set[m[1]]; dup {
				t.Errorf("%s:%d: %s is set twice", path, n, m[1])
			}
			ef.set[m[1]] = m[2]
		}
	}
	return ef
}

func TestEnvFile(t *testing.T) {
	const path = "systemd/vpp-route-agent.env"
	ef := parseEnvFile(t, path)
	checkExampleAddresses(t, path, readFile(t, path))

	for _, name := range []string{"ETCD_ENDPOINTS", "VPP_ROUTE_AGENT_UPLINK_INTERFACE", "VPP_ROUTE_AGENT_UPLINK_ADDRESS"} {
		if v := ef.set[name]; v == "" {
			t.Errorf("%s: %s should be set (uncommented) with an example value", path, name)
		}
	}
	if _, set := ef.set["NODENAME"]; set {
		t.Errorf("%s: NODENAME should stay commented: the agent falls back to /var/lib/calico/nodename and the hostname", path)
	}
	if _, doc := ef.documented["NODENAME"]; !doc {
		t.Errorf("%s: NODENAME should be documented", path)
	}
	for name := range ef.set {
		if !isAgentVariable(name) {
			t.Errorf("%s: %s is set, but it is not one of the agent's variables", path, name)
		}
	}

	t.Run("matches agent flags", func(t *testing.T) {
		flags := agentFlags(t)
		for name := range ef.documented {
			if _, ok := flags[name]; !ok && !knownNonFlag(name) {
				t.Errorf("%s documents %s, which is no flag's environment variable in vpp-route-agent --help", path, name)
			}
		}
		for env, f := range flags {
			docs, documented := ef.documented[env]
			if !documented {
				t.Errorf("%s does not document --%s: add a commented %s=<default> line", path, f.name, env)
				continue
			}
			if f.hasDf && !slices.Contains(docs, f.def) {
				t.Errorf("%s: --%s defaults to %q, but no commented line reads \"# %s=%s\" (found %q)", path, f.name, f.def, env, f.def, docs)
			}
		}
	})
}

// TestDeployFilesNameKnownVariables checks the agent variables named anywhere in the deploy files
// (unit comments, DaemonSet env, prose) against the agent's flags.
func TestDeployFilesNameKnownVariables(t *testing.T) {
	var files []string
	for _, pattern := range []string{"kubernetes/*.yaml", "systemd/*", "cni/*"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	mentioned := map[string][]string{}
	for _, f := range files {
		for _, m := range agentVariableMention.FindAllString(string(readFile(t, f)), -1) {
			if !slices.Contains(mentioned[m], f) {
				mentioned[m] = append(mentioned[m], f)
			}
		}
	}
	flags := agentFlags(t)
	for name, where := range mentioned {
		if _, ok := flags[name]; !ok && !knownNonFlag(name) {
			t.Errorf("%v name %s, which is no flag's environment variable in vpp-route-agent --help", where, name)
		}
	}
}

// knownNonFlag reports whether name is the password variable and --help (already built) names it.
func knownNonFlag(name string) bool {
	return name == passwordVariable && strings.Contains(agentBuild.help, "$"+passwordVariable)
}

// ---- Kubernetes ----------------------------------------------------------------------------------

// documentSeparator splits a multi-document YAML stream on its "---" lines.
var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// k8sDocuments parses every YAML document of a file into JSON-shaped values, leaving out empty ones
// (a leading comment block, a trailing "---").
func k8sDocuments(t *testing.T, path string) []map[string]any {
	t.Helper()
	var docs []map[string]any
	for i, part := range documentSeparator.Split(string(readFile(t, path)), -1) {
		j, err := yaml.YAMLToJSON([]byte(part))
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		var doc map[string]any
		if err := json.Unmarshal(j, &doc); err != nil {
			t.Fatalf("%s: document %d is not a mapping: %v", path, i, err)
		}
		if doc == nil {
			continue
		}
		for _, key := range []string{"apiVersion", "kind"} {
			if s, _ := doc[key].(string); s == "" {
				t.Errorf("%s: document %d has no %s", path, i, key)
			}
		}
		docs = append(docs, doc)
	}
	return docs
}

// at walks a JSON-shaped value along map keys and list indexes; nil when the path does not exist.
func at(v any, path ...any) any {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[p]
		case int:
			l, ok := v.([]any)
			if !ok || p >= len(l) {
				return nil
			}
			v = l[p]
		}
	}
	return v
}

func list(v any) []any { l, _ := v.([]any); return l }

// named returns the element of a list of objects whose "name" is name.
func named(l any, name string) any {
	for _, e := range list(l) {
		if at(e, "name") == name {
			return e
		}
	}
	return nil
}

func TestKubernetesManifests(t *testing.T) {
	var daemonSets []map[string]any
	for _, f := range glob(t, "kubernetes/*.yaml") {
		checkExampleAddresses(t, f, readFile(t, f))
		for _, doc := range k8sDocuments(t, f) {
			if ns := at(doc, "metadata", "namespace"); ns != "kube-system" {
				t.Errorf("%s: %s %v is in namespace %v, want kube-system", f, doc["kind"], at(doc, "metadata", "name"), ns)
			}
			if doc["kind"] == "DaemonSet" {
				daemonSets = append(daemonSets, doc)
			}
		}
	}
	if len(daemonSets) != 1 {
		t.Fatalf("found %d DaemonSets, want 1", len(daemonSets))
	}
	ds := daemonSets[0]
	if ds["apiVersion"] != "apps/v1" {
		t.Errorf("DaemonSet apiVersion %v, want apps/v1", ds["apiVersion"])
	}
	spec := at(ds, "spec", "template", "spec")
	want := func(what string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}

	want("updateStrategy.type", at(ds, "spec", "updateStrategy", "type"), "RollingUpdate")
	want("updateStrategy.rollingUpdate.maxUnavailable", at(ds, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"), 1)
	want("hostNetwork", at(spec, "hostNetwork"), true)
	want("dnsPolicy", at(spec, "dnsPolicy"), "ClusterFirstWithHostNet")
	want("priorityClassName", at(spec, "priorityClassName"), "system-node-critical")
	want("terminationGracePeriodSeconds", at(spec, "terminationGracePeriodSeconds"), 15)
	want("securityContext.seccompProfile.type", at(spec, "securityContext", "seccompProfile", "type"), "RuntimeDefault")
	if len(list(at(spec, "securityContext", "supplementalGroups"))) == 0 {
		t.Errorf("securityContext.supplementalGroups is empty: the agent needs the vpp group's gid for the API socket")
	}
	tolerateAll := false
	for _, tol := range list(at(spec, "tolerations")) {
		if at(tol, "operator") == "Exists" && at(tol, "key") == nil && at(tol, "effect") == nil {
			tolerateAll = true
		}
	}
	if !tolerateAll {
		t.Errorf("tolerations %v: want one {operator: Exists} without key and effect (tolerate every taint)", at(spec, "tolerations"))
	}
	// The agent's HTTP server is on loopback unless the DaemonSet says otherwise: no scrape
	// annotation may point Prometheus at a port nobody listens on from outside.
	annotations := at(ds, "spec", "template", "metadata", "annotations")
	if at(annotations, "prometheus.io/scrape") == "true" {
		c := list(at(spec, "containers"))
		if len(c) == 0 || named(at(c[0], "env"), "VPP_ROUTE_AGENT_METRICS_ADDRESS") == nil {
			t.Errorf("prometheus.io/scrape is set but the metrics server stays on loopback (no VPP_ROUTE_AGENT_METRICS_ADDRESS)")
		}
	}

	// Volumes: host directories, never the socket file itself.
	hostPaths := map[string]string{} // volume name -> host path
	for _, v := range list(at(spec, "volumes")) {
		if p, ok := at(v, "hostPath", "path").(string); ok {
			hostPaths[at(v, "name").(string)] = p
			if strings.HasSuffix(p, ".sock") {
				t.Errorf("volume %v mounts the socket file %s: mount its directory (VPP recreates the socket)", at(v, "name"), p)
			}
			if typ := at(v, "hostPath", "type"); typ != "Directory" && typ != "DirectoryOrCreate" {
				t.Errorf("hostPath %s has type %v, want Directory or DirectoryOrCreate", p, typ)
			}
		}
	}
	secretVolume := ""
	for _, v := range list(at(spec, "volumes")) {
		if at(v, "secret", "secretName") == "calico-etcd-secrets" {
			secretVolume = at(v, "name").(string)
		}
	}
	if secretVolume == "" {
		t.Errorf("no volume of the Secret calico-etcd-secrets")
	}
	// mounts maps a container's mount paths to (host path or volume name, read-only).
	type mount struct {
		source   string
		readOnly bool
	}
	mounts := func(c any) map[string]mount {
		out := map[string]mount{}
		for _, m := range list(at(c, "volumeMounts")) {
			name := at(m, "name").(string)
			src := name
			if p, ok := hostPaths[name]; ok {
				src = p
			}
			ro, _ := at(m, "readOnly").(bool)
			out[at(m, "mountPath").(string)] = mount{src, ro}
		}
		return out
	}

	containers := list(at(spec, "containers"))
	if len(containers) != 2 {
		t.Fatalf("%d containers, want 2 (the agent and block-ipamd)", len(containers))
	}
	agent := named(containers, "vpp-route-agent")
	ipamd := named(containers, "block-ipamd")
	if agent == nil || ipamd == nil {
		t.Fatalf("containers %v: want vpp-route-agent and block-ipamd", containers)
	}
	image := at(agent, "image")
	if image == nil || image == "" {
		t.Errorf("the agent container has no image")
	}

	// Every container: the hardening of the brief.
	for _, c := range append(list(at(spec, "initContainers")), containers...) {
		name := at(c, "name")
		sc := at(c, "securityContext")
		want(fmt.Sprintf("%v: allowPrivilegeEscalation", name), at(sc, "allowPrivilegeEscalation"), false)
		want(fmt.Sprintf("%v: readOnlyRootFilesystem", name), at(sc, "readOnlyRootFilesystem"), true)
		if drop := list(at(sc, "capabilities", "drop")); !slices.Contains(drop, any("ALL")) {
			t.Errorf("%v: capabilities.drop = %v, want ALL", name, drop)
		}
		if add := at(sc, "capabilities", "add"); add != nil {
			t.Errorf("%v: capabilities.add = %v, want none", name, add)
		}
		if at(sc, "privileged") == true {
			t.Errorf("%v: privileged", name)
		}
		if at(c, "image") != image {
			t.Errorf("%v: image %v, want the agent's %v (one image holds all binaries)", name, at(c, "image"), image)
		}
		if at(c, "resources", "requests", "memory") == nil || at(c, "resources", "limits", "memory") == nil {
			t.Errorf("%v: want memory requests and limits", name)
		}
	}

	// The agent container.
	sc := at(agent, "securityContext")
	want("agent runAsNonRoot", at(sc, "runAsNonRoot"), true)
	if uid, ok := at(sc, "runAsUser").(float64); !ok || uid == 0 {
		t.Errorf("agent runAsUser = %v, want a non-zero uid", at(sc, "runAsUser"))
	}
	want("agent requests.cpu", at(agent, "resources", "requests", "cpu") != nil, true)
	am := mounts(agent)
	if m, ok := am["/run/vpp"]; !ok || m.source != "/run/vpp" {
		t.Errorf("the agent does not mount the host directory /run/vpp at /run/vpp: %v", am)
	}
	if m, ok := am["/var/lib/calico"]; !ok || m.source != "/var/lib/calico" || !m.readOnly {
		t.Errorf("the agent does not mount the host's /var/lib/calico read-only: %v", am)
	}
	if m, ok := am["/calico-secrets"]; !ok || m.source != secretVolume || !m.readOnly {
		t.Errorf("the agent does not mount calico-etcd-secrets read-only at /calico-secrets: %v", am)
	}

	env := at(agent, "env")
	want("env NODENAME fieldRef", at(named(env, "NODENAME"), "valueFrom", "fieldRef", "fieldPath"), "spec.nodeName")
	for name, key := range map[string]string{"ETCD_ENDPOINTS": "etcd_endpoints", "ETCD_CA_CERT_FILE": "etcd_ca",
		"ETCD_CERT_FILE": "etcd_cert", "ETCD_KEY_FILE": "etcd_key"} {
		ref := at(named(env, name), "valueFrom", "configMapKeyRef")
		if at(ref, "name") != "calico-config" || at(ref, "key") != key {
			t.Errorf("env %s = %v, want configMapKeyRef calico-config/%s", name, ref, key)
		}
	}
	if named(env, "VPP_ROUTE_AGENT_UPLINK_INTERFACE") == nil && named(env, "VPP_ROUTE_AGENT_UPLINK_SW_IF_INDEX") == nil {
		t.Errorf("env: no uplink (VPP_ROUTE_AGENT_UPLINK_INTERFACE)")
	}
	if named(env, "VPP_ROUTE_AGENT_UPLINK_ADDRESS") == nil && named(env, "VPP_ROUTE_AGENT_PEER_IP") == nil {
		t.Errorf("env: no peer IP (VPP_ROUTE_AGENT_UPLINK_ADDRESS or VPP_ROUTE_AGENT_PEER_IP)")
	}

	// With hostNetwork an httpGet probe connects to the node's address, where a server on loopback
	// does not listen: the probes exec `vpp-route-agent probe`, which asks 127.0.0.1.
	for probe, p := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		want(probe+" exec", at(agent, probe, "exec", "command"), []any{"/usr/local/bin/vpp-route-agent", "probe", p})
		if at(agent, probe, "httpGet") != nil {
			t.Errorf("%s uses httpGet: the agent's server listens on loopback", probe)
		}
	}

	// block-ipam's daemon: the socket's host directory shared, etcd as the agent has it, exec probes.
	want("block-ipamd command", at(ipamd, "command"), []any{"/usr/local/bin/block-ipamd"})
	im := mounts(ipamd)
	if m, ok := im["/run/block-ipam"]; !ok || m.source != "/run/block-ipam" || m.readOnly {
		t.Errorf("block-ipamd does not mount the host directory /run/block-ipam writable at /run/block-ipam: %v", im)
	}
	if m, ok := im["/calico-secrets"]; !ok || m.source != secretVolume || !m.readOnly {
		t.Errorf("block-ipamd does not mount calico-etcd-secrets read-only at /calico-secrets: %v", im)
	}
	ienv := at(ipamd, "env")
	want("block-ipamd env NODENAME fieldRef", at(named(ienv, "NODENAME"), "valueFrom", "fieldRef", "fieldPath"), "spec.nodeName")
	for _, name := range []string{"ETCD_ENDPOINTS", "ETCD_CA_CERT_FILE", "ETCD_CERT_FILE", "ETCD_KEY_FILE"} {
		if fmt.Sprint(at(named(ienv, name), "valueFrom")) != fmt.Sprint(at(named(env, name), "valueFrom")) {
			t.Errorf("block-ipamd env %s differs from the agent's", name)
		}
	}
	for probe, p := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		want("block-ipamd "+probe+" exec", at(ipamd, probe, "exec", "command"),
			[]any{"/usr/local/bin/vpp-route-agent", "probe", "--metrics-address", "127.0.0.1:9483", p})
	}

	// The block-ipam installer.
	var installer any
	for _, c := range list(at(spec, "initContainers")) {
		argv := append(list(at(c, "command")), list(at(c, "args"))...)
		if len(argv) > 0 && path.Base(fmt.Sprint(argv[0])) == "block-ipam" {
			installer = c
			want("installer argv", argv, []any{"/usr/local/bin/block-ipam", "install", "--dest", "/host/opt/cni/bin"})
		}
	}
	if installer == nil {
		t.Fatalf("no initContainer runs block-ipam install")
	}
	if m, ok := mounts(installer)["/host/opt/cni/bin"]; !ok || m.source != "/opt/cni/bin" || m.readOnly {
		t.Errorf("the installer does not mount the host's /opt/cni/bin writable at /host/opt/cni/bin: %v", mounts(installer))
	}

	t.Run("env names agent flags", func(t *testing.T) {
		flags := agentFlags(t)
		for _, e := range list(env) {
			name := at(e, "name").(string)
			if _, ok := flags[name]; isAgentVariable(name) && !ok && !knownNonFlag(name) {
				t.Errorf("env %s is no flag's environment variable in vpp-route-agent --help", name)
			}
		}
	})
}

// ---- CNI network configurations ------------------------------------------------------------------

// blockIPAMKeys are the keys block-ipam reads from a network configuration's ipam section.
var blockIPAMKeys = []string{
	"type", "socket", "etcd_endpoints", "etcd_ca_cert_file", "etcd_cert_file", "etcd_key_file", "nodename",
	"ipv4_pools", "ipv6_pools", "assign_ipv4", "assign_ipv6", "exclude", "routes", "dns", "resolvConf",
	"max_blocks_per_host", "result_prefix", "log_file", "gateways",
}

// etcdKeys may sit in the ipam section or, as calico-ipam has them, at the plugin's top level.
var etcdKeys = []string{"etcd_endpoints", "etcd_ca_cert_file", "etcd_cert_file", "etcd_key_file", "nodename"}

// boolOrString reports whether v is a boolean or the string "true" or "false" (calico-ipam's form).
func boolOrString(v any) (bool, bool) {
	switch v := v.(type) {
	case bool:
		return v, true
	case string:
		b, err := strconv.ParseBool(v)
		return b, err == nil && (v == "true" || v == "false")
	}
	return false, false
}

func TestCNIConfigs(t *testing.T) {
	seen := map[string]map[string]any{} // file name -> ipam section
	for _, f := range glob(t, "cni/*") {
		if filepath.Ext(f) != ".conflist" {
			continue
		}
		text := readFile(t, f)
		checkExampleAddresses(t, f, text)
		var conf map[string]any
		if err := json.Unmarshal(text, &conf); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if conf["cniVersion"] != "1.1.0" {
			t.Errorf("%s: cniVersion %v, want 1.1.0", f, conf["cniVersion"])
		}
		if s, _ := conf["name"].(string); s == "" {
			t.Errorf("%s: no network name", f)
		}
		var ipam map[string]any
		for i, p := range list(conf["plugins"]) {
			if s, _ := at(p, "type").(string); s == "" {
				t.Errorf("%s: plugin %d has no type", f, i)
			}
			ip, ok := at(p, "ipam").(map[string]any)
			if !ok {
				continue
			}
			if ipam != nil {
				t.Errorf("%s: more than one plugin has an ipam section", f)
			}
			ipam = ip
			for _, k := range etcdKeys {
				if at(p, k) != nil && ip[k] != nil {
					t.Errorf("%s: %s is both in ipam and at the plugin's top level", f, k)
				}
			}
		}
		if ipam == nil {
			t.Errorf("%s: no plugin has an ipam section", f)
			continue
		}
		seen[filepath.Base(f)] = ipam
		if ipam["type"] != "block-ipam" {
			t.Errorf("%s: ipam type %v, want block-ipam", f, ipam["type"])
		}
		for k, v := range ipam {
			if !slices.Contains(blockIPAMKeys, k) {
				t.Errorf("%s: ipam key %q is not one block-ipam reads", f, k)
				continue
			}
			switch k {
			case "assign_ipv4", "assign_ipv6":
				if _, ok := boolOrString(v); !ok {
					t.Errorf("%s: %s = %#v, want true, false, \"true\" or \"false\"", f, k, v)
				}
			case "result_prefix":
				if v != "host" && v != "block" {
					t.Errorf("%s: result_prefix = %v, want host or block", f, v)
				}
			case "exclude":
				for _, c := range list(v) {
					p, err := netip.ParsePrefix(fmt.Sprint(c))
					if err != nil || p != p.Masked() {
						t.Errorf("%s: exclude %v is not a canonical CIDR (%v)", f, c, err)
					}
				}
			case "ipv4_pools", "ipv6_pools":
				if len(list(v)) == 0 {
					t.Errorf("%s: %s = %v, want a non-empty list of CIDRs or IPPool names", f, k, v)
				}
			case "max_blocks_per_host":
				if n, ok := v.(float64); !ok || n < 0 || n != float64(int(n)) {
					t.Errorf("%s: max_blocks_per_host = %v, want a non-negative integer", f, v)
				}
			}
		}
	}

	// What each example is there to show.
	if ipam := seen["10-vpp-ptp.conflist"]; ipam == nil {
		t.Errorf("cni/10-vpp-ptp.conflist is missing")
	}
	if ipam := seen["20-dual-stack.conflist"]; ipam == nil {
		t.Errorf("cni/20-dual-stack.conflist is missing")
	} else {
		if b, _ := boolOrString(ipam["assign_ipv6"]); !b {
			t.Errorf("20-dual-stack.conflist: assign_ipv6 is not true")
		}
		if ipam["ipv4_pools"] == nil || ipam["ipv6_pools"] == nil {
			t.Errorf("20-dual-stack.conflist: want both ipv4_pools and ipv6_pools")
		}
	}
	if ipam := seen["30-static-ips.conflist"]; ipam == nil {
		t.Errorf("cni/30-static-ips.conflist is missing")
	} else if ipam["exclude"] == nil {
		t.Errorf("30-static-ips.conflist: want exclude")
	}
	if conf := readFile(t, "cni/30-static-ips.conflist"); !regexp.MustCompile(`"ips":\s*true`).Match(conf) {
		t.Errorf("30-static-ips.conflist: want the capability ips")
	}
}

// ---- Dockerfile ----------------------------------------------------------------------------------

// TestDockerfile checks what the image promises to the deploy files; Docker itself cannot run here.
func TestDockerfile(t *testing.T) {
	df := string(readFile(t, filepath.Join(repoRoot, "Dockerfile")))
	lines := strings.Split(strings.ReplaceAll(df, "\\\n", " "), "\n") // join continuation lines
	var froms, users, entrypoints, exposes []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms = append(froms, l)
		case "USER":
			users = append(users, f[1])
		case "ENTRYPOINT":
			entrypoints = append(entrypoints, strings.Join(f[1:], " "))
		case "EXPOSE":
			exposes = append(exposes, f[1:]...)
		}
	}
	if len(froms) < 2 || !strings.Contains(froms[len(froms)-1], "gcr.io/distroless/static") {
		t.Errorf("want a multi-stage build ending on distroless/static, got FROM lines %q", froms)
	}
	if len(users) == 0 || users[len(users)-1] != "65532:65532" {
		t.Errorf("USER %v: want the final stage to run as 65532:65532 (numeric, for runAsNonRoot)", users)
	}
	if len(entrypoints) == 0 || entrypoints[len(entrypoints)-1] != `["/usr/local/bin/vpp-route-agent"]` {
		t.Errorf("ENTRYPOINT %v, want [\"/usr/local/bin/vpp-route-agent\"]", entrypoints)
	}
	if !slices.Contains(exposes, "9482") {
		t.Errorf("EXPOSE %v, want 9482 (the metrics port of the DaemonSet)", exposes)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "COPY go.mod go.sum ./", "go mod download"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}

	// The version is stamped into a variable that exists.
	m := regexp.MustCompile(`-X (github\.com/vpp-route-agent/vpp-route-agent/(\S+))\.(\w+)=`).FindStringSubmatch(df)
	if m == nil {
		t.Fatalf("no -ldflags -X <module>/<package>.<var>= in the Dockerfile")
	}
	pkgDir := filepath.Join(repoRoot, filepath.FromSlash(m[2]))
	found := false
	files, _ := filepath.Glob(filepath.Join(pkgDir, "*.go"))
	for _, f := range files {
		if regexp.MustCompile(`(?m)^var ` + m[3] + ` = "`).Match(readFile(t, f)) {
			found = true
		}
	}
	if !found {
		t.Errorf("-X %s.%s: no string variable %s in %s", m[1], m[3], m[3], pkgDir)
	}

	// Every binary the DaemonSet runs comes out of the build and into /usr/local/bin.
	for _, bin := range []string{"vpp-route-agent", "block-ipam", "vppsim"} {
		if !strings.Contains(df, "./cmd/"+bin) || !strings.Contains(df, "/out/"+bin) {
			t.Errorf("the Dockerfile does not build ./cmd/%s and copy /out/%s", bin, bin)
		}
		t.Run(bin, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join(repoRoot, "cmd", bin, "main.go")); err != nil {
				t.Skipf("cmd/%s is not in this tree yet: the Dockerfile's go build would fail until it is merged", bin)
			}
		})
	}
}

// TestCNIConfigsLoadInBlockIPAM feeds every example's block-ipam plugin entry to block-ipam's own
// configuration loader, as libcni would (network name and cniVersion injected). The etcd TLS file
// paths are host-specific (the runtime runs the plugin on the host, where Calico's installer wrote
// them), so they are left out here; every other field must load.
func TestCNIConfigsLoadInBlockIPAM(t *testing.T) {
	for _, f := range glob(t, "cni/*.conflist") {
		var conf struct {
			CNIVersion string           `json:"cniVersion"`
			Name       string           `json:"name"`
			Plugins    []map[string]any `json:"plugins"`
		}
		if err := json.Unmarshal(readFile(t, f), &conf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		loaded := 0
		for _, p := range conf.Plugins {
			ipam, _ := p["ipam"].(map[string]any)
			if ipam == nil || ipam["type"] != "block-ipam" {
				continue
			}
			for _, m := range []map[string]any{p, ipam} {
				for _, k := range []string{"etcd_ca_cert_file", "etcd_cert_file", "etcd_key_file", "resolvConf", "log_file"} {
					delete(m, k)
				}
			}
			p["name"], p["cniVersion"] = conf.Name, conf.CNIVersion
			stdin, _ := json.Marshal(p)
			cfg, err := cni.LoadConfig("ADD", stdin, "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;IgnoreUnknown=1")
			if err != nil {
				t.Errorf("%s: block-ipam rejects the example: %v", f, err)
				continue
			}
			if cfg == nil {
				t.Errorf("%s: no configuration", f)
			}
			loaded++
		}
		if loaded != 1 {
			t.Errorf("%s: %d block-ipam plugins loaded, want 1", f, loaded)
		}
	}
}
