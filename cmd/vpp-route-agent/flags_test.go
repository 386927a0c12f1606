package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// A valid base command line; each case changes one thing.
var base = []string{"--nodename", "n1", "--uplink-interface", "GigabitEthernet0/8/0", "--uplink-address", "192.0.2.1/24"}

func TestDaemonFlagsRejectBadInputNamingTheField(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--nodename", "n1", "--uplink-address", "192.0.2.1/24"}, nil, "--uplink-interface or --uplink-sw-if-index is required"},
		{append(base, "--uplink-sw-if-index", "3"), nil, "--uplink-interface and --uplink-sw-if-index are exclusive"},
		{[]string{"--nodename", "n1", "--uplink-interface", "x"}, nil, "--uplink-address or --peer-ip is required"},
		{[]string{"--nodename", "n1", "--uplink-interface", "x", "--uplink-address", "192.0.2.300/24"}, nil, "--uplink-address"},
		{[]string{"--nodename", "n1", "--uplink-interface", "x", "--uplink-address", "192.0.2.1/24,192.0.2.2/24"}, nil, "one per family"},
		{append(base, "--peer-ip", "192.0.2.9"), nil, "--peer-ip and --uplink-address are exclusive"},
		{[]string{"--nodename", "n1", "--uplink-interface", "x", "--peer-ip", "nonsense"}, nil, "--peer-ip"},
		{append(base, "--etcd-endpoints", "127.0.0.1:2379"), nil, "--etcd-endpoints"},
		{append(base, "--etcd-cert-file", "/nonexistent/cert.pem", "--etcd-key-file", "/nonexistent/key.pem"), nil, "--etcd-cert-file"},
		{append(base, "--etcd-cert-file", "/etc/hostname"), nil, "--etcd-cert-file and --etcd-key-file go together"},
		{append(base, "--pool-cidr", "10.244.0.1/16"), nil, "--pool-cidr: 10.244.0.1/16 has host bits set"},
		{append(base, "--pool-cidr", "bogus"), nil, "--pool-cidr"},
		{append(base, "--block-prefix", "/calico/ipam/v2/assignment"), nil, "--block-prefix"},
		{append(base, "--registration-ttl", "1s"), nil, "--registration-ttl"},
		{append(base, "--resync-interval", "10ms"), nil, "--resync-interval"},
		{append(base, "--peer-loss-grace", "-1s"), nil, "--peer-loss-grace"},
		{append(base, "--log-level", "chatty"), nil, "--log-level"},
		{append(base, "--bfd", "--bfd-interval", "5ms"), nil, "--bfd-interval 5ms: want 10ms to 1m0s"},
		{append(base, "--bfd", "--bfd-interval", "61s"), nil, "--bfd-interval"},
		{append(base, "--bfd-multiplier", "1"), nil, "--bfd-multiplier 1: want 2 to 255"},
		{append(base, "--bfd-multiplier", "256"), nil, "--bfd-multiplier 256"},
		{base, map[string]string{"VPP_ROUTE_AGENT_BFD_MULTIPLIER": "1"}, "--bfd-multiplier"},
		{[]string{"--nodename", "n1", "--uplink-interface", "x", "--peer-ip", "192.0.2.9", "--bfd"}, nil, "--bfd needs --uplink-address"},
		{append(base, "--log-format", "xml"), nil, "--log-format"},
		{append(base, "--metrics-address", "9482"), nil, "--metrics-address"},
		{append(base, "--table-id", "-1"), nil, "table-id"},
		{append(base, "--no-such-flag"), nil, "unknown flag: --no-such-flag"},
		{append(base, "extra"), nil, "unexpected arguments: extra"},
		{base, map[string]string{"VPP_ROUTE_AGENT_TABLE_ID": "x"}, "environment VPP_ROUTE_AGENT_TABLE_ID (for --table-id)"},
		{base, map[string]string{"ETCD_ENDPOINTS": "localhost:2379"}, "--etcd-endpoints"},
		{append(base, "--nodename", "a/b"), nil, "--nodename (from --nodename or $NODENAME): node name \"a/b\" contains '/'"},
		{append(base, "--nodename", "a\nb"), nil, "control or space character"},
		{append(base, "--nodename", "a\x01b"), nil, "control or space character"},
		{[]string{"--uplink-interface", "x", "--uplink-address", "192.0.2.1/24"}, map[string]string{"NODENAME": ".."}, "--nodename (from --nodename or $NODENAME)"},
		{append(base, "--etcd-ca-cert-file", "/etc/hostname"), nil, "--etcd-ca-cert-file is set but --etcd-endpoints are http:// (plaintext)"},
		{append(base, "--etcd-ca-file", "/etc/hostname"), nil, "--etcd-ca-cert-file is set but --etcd-endpoints are http://"},
		{base, map[string]string{"ETCD_CA_CERT_FILE": "/etc/hostname"}, "--etcd-ca-cert-file is set but"},
		{append(base, "--etcd-endpoints", "https://192.0.2.1:2379", "--etcd-ca-cert-file", "/etc/hostname"), nil, "--etcd-ca-cert-file: /etc/hostname holds no PEM certificate"},
		{append(base, "--etcd-endpoints", "http://192.0.2.1:2379,https://192.0.2.2:2379"), nil, "mixes http:// and https://"},
		{append(base, "--etcd-endpoints", "http://root:s3cret@192.0.2.1:2379"), nil, "http://root:xxxxx@192.0.2.1:2379 carries credentials in the URL"},
		{append(base, "--etcd-username", "agent"), nil, "--etcd-username \"agent\": no password: set $ETCD_PASSWORD or --etcd-password-file"},
		{base, map[string]string{"ETCD_PASSWORD": "s3cret"}, "an etcd password is set"},
		{append(base, "--etcd-username", "agent", "--etcd-password-file", "/nonexistent/pw"), nil, "--etcd-password-file"},
		{append(base, "--etcd-request-timeout", "0s"), nil, "--etcd-request-timeout must be positive"},
	}
	for _, tc := range tests {
		var stderr bytes.Buffer
		// run, not parseDaemonFlags: a failure must come before any connection is attempted, and the
		// default etcd endpoint and VPP socket do not exist here, so a connection would hang or fail later.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := run(ctx, tc.args, &bytes.Buffer{}, &stderr, env(tc.env))
		cancel()
		if err == nil || !isUsage(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q env %v: err = %v, want a usage error containing %q", tc.args, tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error()+stderr.String(), "s3cret") {
			t.Errorf("%q: the password is in the error or the output: %v", tc.args, err)
		}
	}
}

func TestDaemonFlagsFromEnvironment(t *testing.T) {
	cfg, err := parseDaemonFlags([]string{"--uplink-interface", "eth-flag"}, &bytes.Buffer{}, &bytes.Buffer{}, env(map[string]string{
		"NODENAME":                             "node-env",
		"ETCD_ENDPOINTS":                       "http://10.0.0.1:2379,http://10.0.0.2:2379",
		"VPP_ROUTE_AGENT_UPLINK_INTERFACE":     "eth-env", // the flag wins
		"VPP_ROUTE_AGENT_UPLINK_ADDRESS":       "192.0.2.7/24,2001:db8::7/64",
		"VPP_ROUTE_AGENT_TABLE_ID":             "7",
		"VPP_ROUTE_AGENT_POOL_CIDR":            "10.244.0.0/16,fd00:10:244::/48",
		"VPP_ROUTE_AGENT_PEER_LOSS_GRACE":      "0s",
		"VPP_ROUTE_AGENT_WITHDRAW_ON_EXIT":     "true",
		"VPP_ROUTE_AGENT_METRICS_ADDRESS":      "127.0.0.1:0",
		"VPP_ROUTE_AGENT_REGISTRATION_TTL":     "45s",
		"VPP_ROUTE_AGENT_LEGACY_HOST_AFFINITY": "false",
		"VPP_ROUTE_AGENT_BFD":                  "true",
		"VPP_ROUTE_AGENT_BFD_INTERVAL":         "100ms",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.node != "node-env" || cfg.uplink.Name != "eth-flag" || cfg.agent.TableID != 7 || !cfg.agent.WithdrawOnExit ||
		cfg.registrationTTL != 45*time.Second || cfg.etcd.legacyHostAffinity || len(cfg.etcd.Endpoints) != 2 {
		t.Errorf("config from env: %+v", cfg)
	}
	wantPeers := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")}
	if len(cfg.peerIPs) != 2 || cfg.peerIPs[0] != wantPeers[0] || cfg.peerIPs[1] != wantPeers[1] {
		t.Errorf("peer IPs %v", cfg.peerIPs)
	}
	if len(cfg.agent.Pools) != 2 || len(cfg.uplink.Addresses) != 2 {
		t.Errorf("pools %v, uplink addresses %v", cfg.agent.Pools, cfg.uplink.Addresses)
	}
	if cfg.agent.PeerLossGrace != 0 {
		t.Errorf("--peer-loss-grace 0 became %s", cfg.agent.PeerLossGrace)
	}
	if want := (agent.BFDConfig{Enabled: true, Interval: 100 * time.Millisecond, Multiplier: 3}); cfg.agent.BFD != want {
		t.Errorf("BFD %+v, want %+v", cfg.agent.BFD, want)
	}
	if got := cfg.bfdPeerIPs(); len(got) != 2 || got[0] != wantPeers[0] || got[1] != wantPeers[1] {
		t.Errorf("BFD advertised on %v, want the uplink addresses", got)
	}
}

func TestEtcdCredentialsFromEnvironmentAndFile(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("from-file\n"), 0o600)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{append(base, "--etcd-password-file", pw), map[string]string{"ETCD_USERNAME": "agent"}, "from-file"},
		{base, map[string]string{"ETCD_USERNAME": "agent", "ETCD_PASSWORD": "from-env"}, "from-env"},
	} {
		cfg, err := parseDaemonFlags(tc.args, &bytes.Buffer{}, &bytes.Buffer{}, env(tc.env))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.etcd.Username != "agent" || cfg.etcd.Password != tc.want {
			t.Errorf("%q %v: user %q password %q, want agent/%s", tc.args, tc.env, cfg.etcd.Username, cfg.etcd.Password, tc.want)
		}
	}
	// The deprecated alias still sets the CA file, and says it is deprecated.
	var stderr bytes.Buffer
	cfg, err := parseDaemonFlags(append(base, "--etcd-ca-file", "/x.pem", "--etcd-endpoints", "https://192.0.2.1:2379"), &bytes.Buffer{}, &stderr, env(nil))
	if err == nil || !strings.Contains(err.Error(), "--etcd-ca-cert-file: open /x.pem") || !strings.Contains(stderr.String(), "deprecated") {
		t.Errorf("--etcd-ca-file: %v %v; stderr %q", cfg, err, stderr.String())
	}
}

func TestVersionAndHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, &out, &errOut, env(nil)); err != nil || !strings.HasPrefix(out.String(), "vpp-route-agent ") {
		t.Errorf("--version: %v, %q", err, out.String())
	}
	out.Reset()
	err := run(context.Background(), []string{"--help"}, &out, &errOut, env(nil))
	if err == nil || !strings.Contains(errOut.String(), "--withdraw-on-exit") || !strings.Contains(errOut.String(), "(env ETCD_ENDPOINTS)") {
		t.Errorf("--help: %v\n%s", err, errOut.String())
	}
}

// TestEtcdFlagErrorsAreDeterministic: with several bad flags the same one is always reported (the
// checks once ranged over a map, and the flags test above failed about one run in three).
func TestEtcdFlagErrorsAreDeterministic(t *testing.T) {
	for _, tc := range []struct {
		flags etcdFlags
		want  string
	}{
		{etcdFlags{Config: etcdconfig.Config{Endpoints: []string{"https://127.0.0.1:2379"}, DialTimeout: time.Second, RequestTimeout: time.Second,
			CACertFile: "/nonexistent/ca.pem", CertFile: "/nonexistent/cert.pem", KeyFile: "/nonexistent/key.pem"}, blockPrefix: "/b/", hostsPrefix: "/h/"}, "--etcd-ca-cert-file:"},
		{etcdFlags{Config: etcdconfig.Config{Endpoints: []string{"http://127.0.0.1:2379"}, DialTimeout: time.Second, RequestTimeout: time.Second},
			blockPrefix: "b", hostsPrefix: "h"}, "--block-prefix:"},
	} {
		for range 50 {
			if err := tc.flags.validate(env(nil)); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("validate() = %v, want an error starting with %q every time", err, tc.want)
			}
		}
	}
}

// TestDaemonFlagsSeveralUplinks: --uplink-interface, --uplink-address and --peer-ip take one entry per
// uplink in the same order ('+' joins one uplink's families), from the command line or the environment;
// the peer IPs come out in uplink order (registered as /1, /2, ...); bad combinations name the flag.
func TestDaemonFlagsSeveralUplinks(t *testing.T) {
	two := []string{"--nodename", "n1", "--uplink-interface", "eth0", "--uplink-interface", "eth1"}
	cfg, err := parseDaemonFlags(append(two, "--uplink-address", "192.0.2.1/24+2001:db8::1/64", "--uplink-address", "198.51.100.1/24"),
		&bytes.Buffer{}, &bytes.Buffer{}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.uplink.Name != "eth0" || len(cfg.moreUplinks) != 1 || cfg.moreUplinks[0].Name != "eth1" ||
		fmt.Sprint(cfg.uplink.Addresses) != "[192.0.2.1/24 2001:db8::1/64]" || fmt.Sprint(cfg.moreUplinks[0].Addresses) != "[198.51.100.1/24]" {
		t.Errorf("uplinks %+v, %+v", cfg.uplink, cfg.moreUplinks)
	}
	if fmt.Sprint(cfg.peerIPs) != "[192.0.2.1 2001:db8::1 198.51.100.1]" || len(cfg.agent.MoreUplinks) != 1 {
		t.Errorf("peer IPs %v, agent's further uplinks %v", cfg.peerIPs, cfg.agent.MoreUplinks)
	}
	// The environment forms: comma lists, as the DaemonSet and the systemd unit give them.
	cfg, err = parseDaemonFlags(nil, &bytes.Buffer{}, &bytes.Buffer{}, env(map[string]string{"NODENAME": "n1",
		"VPP_ROUTE_AGENT_UPLINK_INTERFACE": "eth0,eth1", "VPP_ROUTE_AGENT_PEER_IP": "192.0.2.1+2001:db8::1,198.51.100.1"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.uplink.Name != "eth0" || len(cfg.moreUplinks) != 1 || fmt.Sprint(cfg.peerIPs) != "[192.0.2.1 2001:db8::1 198.51.100.1]" {
		t.Errorf("from the environment: %+v %+v, peer IPs %v", cfg.uplink, cfg.moreUplinks, cfg.peerIPs)
	}
	// One uplink: both families as separate entries, as before several uplinks existed, or joined.
	for _, addrs := range [][]string{{"--uplink-address", "192.0.2.1/24", "--uplink-address", "2001:db8::1/64"}, {"--uplink-address", "192.0.2.1/24+2001:db8::1/64"}} {
		cfg, err = parseDaemonFlags(append([]string{"--nodename", "n1", "--uplink-interface", "eth0"}, addrs...), &bytes.Buffer{}, &bytes.Buffer{}, env(nil))
		if err != nil || len(cfg.uplink.Addresses) != 2 || len(cfg.moreUplinks) != 0 {
			t.Errorf("%v: %v, %+v", addrs, err, cfg)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(slices.Clone(two), "--uplink-address", "192.0.2.1/24"), "--uplink-address: 1 entries for 2 uplinks"},
		{append(slices.Clone(two), "--peer-ip", "192.0.2.1,198.51.100.1,203.0.113.1"), "--peer-ip: 3 entries for 2 uplinks"},
		{[]string{"--nodename", "n1", "--uplink-interface", "eth0,eth0", "--peer-ip", "192.0.2.1"}, "--uplink-interface: eth0 is given twice"},
		{append(slices.Clone(two), "--uplink-address", "192.0.2.1/24,192.0.2.1/25"), "--uplink-address: 192.0.2.1 is given for uplinks 1 and 2"},
		{append(slices.Clone(two), "--peer-ip", "192.0.2.1+192.0.2.2,198.51.100.1"), "--peer-ip: 192.0.2.1 and 192.0.2.2 are of one family"},
		{append(slices.Clone(two), "--uplink-address", "192.0.2.1/24+x,198.51.100.1/24"), "--uplink-address"},
		{append(slices.Clone(two), "--uplink-sw-if-index", "3", "--peer-ip", "192.0.2.1"), "exclusive"},
	} {
		_, err := parseDaemonFlags(tc.args, &bytes.Buffer{}, &bytes.Buffer{}, env(nil))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
