package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
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
	case "ETCD_ENDPOINTS", "ETCD_CA_CERT_FILE", "ETCD_CERT_FILE", "ETCD_KEY_FILE", "NODENAME":
		return true
	}
	return strings.HasPrefix(name, "VPP_ROUTE_AGENT_")
}

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
		if a.IsLoopback() || a.IsUnspecified() {
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
			if _, ok := flags[name]; !ok {
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
		if _, ok := flags[name]; !ok {
			t.Errorf("%v name %s, which is no flag's environment variable in vpp-route-agent --help", where, name)
		}
	}
}
