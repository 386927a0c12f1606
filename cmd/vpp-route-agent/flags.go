package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// envPrefix is the prefix of the environment fall-back of every flag without a Calico name:
// --table-id falls back to VPP_ROUTE_AGENT_TABLE_ID.
const envPrefix = "VPP_ROUTE_AGENT_"

// calicoEnv maps flags to the environment names Calico uses for the same setting.
var calicoEnv = map[string]string{
	"etcd-endpoints": "ETCD_ENDPOINTS",
	"etcd-ca-file":   "ETCD_CA_CERT_FILE",
	"etcd-cert-file": "ETCD_CERT_FILE",
	"etcd-key-file":  "ETCD_KEY_FILE",
	"nodename":       "NODENAME",
}

// envName returns the environment variable a flag falls back to.
func envName(flag string) string {
	if e, ok := calicoEnv[flag]; ok {
		return e
	}
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its environment variable, and notes the
// variable in the flag's usage so that --help documents it. Repeatable flags take a comma-separated list.
func applyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Name == "version" {
			return
		}
		name := envName(f.Name)
		if f.Changed {
			return
		}
		if v, ok := lookup(name); ok && v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("environment %s (for --%s): %w", name, f.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// annotateEnv adds "(env NAME)" to each flag's usage.
func annotateEnv(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && f.Name != "version" {
			f.Usage += " (env " + envName(f.Name) + ")"
		}
	})
}

// etcdFlags are the datastore flags shared by the daemon and the routes subcommand.
type etcdFlags struct {
	endpoints               []string
	caFile, certFile, keyFn string
	dialTimeout             time.Duration
	blockPrefix             string
	hostsPrefix             string
	nodename                string
	legacyHostAffinity      bool
	poolCIDRs               []string
}

func (e *etcdFlags) register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&e.endpoints, "etcd-endpoints", []string{"http://127.0.0.1:2379"}, "etcd client URLs, comma-separated")
	fs.StringVar(&e.caFile, "etcd-ca-file", "", "CA certificate file that verifies etcd's server certificate")
	fs.StringVar(&e.certFile, "etcd-cert-file", "", "client certificate file for etcd (mutual TLS)")
	fs.StringVar(&e.keyFn, "etcd-key-file", "", "client key file for etcd (mutual TLS)")
	fs.DurationVar(&e.dialTimeout, "etcd-dial-timeout", 5*time.Second, "how long to wait for etcd before an etcd call fails")
	fs.StringVar(&e.blockPrefix, "block-prefix", calico.BlockPrefix, "etcd prefix of Calico's IPAM blocks (both families)")
	fs.StringVar(&e.hostsPrefix, "hosts-prefix", blockwatch.DefaultHostsPrefix, "etcd prefix where nodes register peer IPs: <prefix><node>/peerip/ipv4/1")
	fs.StringVar(&e.nodename, "nodename", "", "this node's name; else $NODENAME, /var/lib/calico/nodename, the lower-cased hostname")
	fs.BoolVar(&e.legacyHostAffinity, "legacy-host-affinity", true, "treat the pre-2016 block field hostAffinity as the owner when affinity is absent")
	fs.StringSliceVar(&e.poolCIDRs, "pool-cidr", nil, "managed pool CIDR (repeatable); default: the enabled Calico IPPools in etcd")
}

// validate checks the flags without opening any connection.
func (e *etcdFlags) validate() error {
	if len(e.endpoints) == 0 {
		return errors.New("--etcd-endpoints: at least one endpoint is required")
	}
	for _, ep := range e.endpoints {
		if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") {
			return fmt.Errorf("--etcd-endpoints: %q must start with http:// or https://", ep)
		}
	}
	if (e.certFile == "") != (e.keyFn == "") {
		return errors.New("--etcd-cert-file and --etcd-key-file go together")
	}
	// Checked in a fixed order (not a map's), so that the same flags always give the same error.
	for _, f := range []struct{ flag, file string }{
		{"--etcd-ca-file", e.caFile}, {"--etcd-cert-file", e.certFile}, {"--etcd-key-file", e.keyFn},
	} {
		if f.file == "" {
			continue
		}
		if _, err := os.Stat(f.file); err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	if e.dialTimeout <= 0 {
		return errors.New("--etcd-dial-timeout must be positive")
	}
	for _, p := range []struct{ flag, prefix string }{{"--block-prefix", e.blockPrefix}, {"--hosts-prefix", e.hostsPrefix}} {
		if !strings.HasPrefix(p.prefix, "/") || !strings.HasSuffix(p.prefix, "/") {
			return fmt.Errorf("%s: %q must start and end with '/'", p.flag, p.prefix)
		}
	}
	if _, err := e.pools(); err != nil {
		return err
	}
	return nil
}

// pools parses --pool-cidr; nil means "the enabled IPPools from etcd".
func (e *etcdFlags) pools() ([]netip.Prefix, error) {
	if len(e.poolCIDRs) == 0 {
		return nil, nil
	}
	out := make([]netip.Prefix, 0, len(e.poolCIDRs))
	for _, s := range e.poolCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--pool-cidr: %w", err)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("--pool-cidr: %s has host bits set (did you mean %s?)", p, p.Masked())
		}
		out = append(out, p)
	}
	return out, nil
}

// client creates the etcd client. clientv3 dials lazily: unreachable endpoints show up as errors of the
// first calls, each of which has a deadline.
func (e *etcdFlags) client() (*clientv3.Client, error) {
	var tlsCfg *tls.Config
	if e.caFile != "" || e.certFile != "" || anyHTTPS(e.endpoints) {
		info := transport.TLSInfo{TrustedCAFile: e.caFile, CertFile: e.certFile, KeyFile: e.keyFn}
		var err error
		if tlsCfg, err = info.ClientConfig(); err != nil {
			return nil, fmt.Errorf("etcd TLS configuration: %w", err)
		}
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:            e.endpoints,
		DialTimeout:          e.dialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  tlsCfg,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(e.endpoints, ","), err)
	}
	return c, nil
}

func anyHTTPS(eps []string) bool {
	for _, ep := range eps {
		if strings.HasPrefix(ep, "https://") {
			return true
		}
	}
	return false
}

// resolveNodeName applies Calico's order: --nodename/NODENAME (already merged), the file
// /var/lib/calico/nodename, then the lower-cased hostname.
func resolveNodeName(flagValue, nodenameFile string) (string, error) {
	if v := strings.TrimSpace(flagValue); v != "" {
		return v, nil
	}
	if b, err := os.ReadFile(nodenameFile); err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			return v, nil
		}
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "", fmt.Errorf("--nodename: not set and the hostname is unknown: %v", err)
	}
	return strings.ToLower(h), nil
}

// newLogger builds the process logger from --log-level and --log-format.
func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is not text or json", format)
}
