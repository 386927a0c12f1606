package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
)

// envPrefix is the prefix of the environment fall-back of every flag without a Calico name:
// --table-id falls back to VPP_ROUTE_AGENT_TABLE_ID.
const envPrefix = "VPP_ROUTE_AGENT_"

// calicoEnv maps flags to the environment names Calico uses for the same setting.
var calicoEnv = func() map[string]string {
	m := map[string]string{"nodename": "NODENAME"}
	for f, e := range etcdconfig.CalicoEnv {
		m[f] = e
	}
	return m
}()

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
		if f.Name == "help" || f.Name == "version" || f.Deprecated != "" {
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

// parseWithEnv documents the environment fall-backs in the usage, parses args and applies the
// environment to the flags not given; errors are usage errors.
func parseWithEnv(fs *pflag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	annotateEnv(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if err := applyEnv(fs, lookup); err != nil {
		return usageError{err}
	}
	return nil
}

// annotateEnv adds "(env NAME)" to each flag's usage.
func annotateEnv(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && f.Name != "version" && f.Deprecated == "" {
			f.Usage += " (env " + envName(f.Name) + ")"
		}
	})
}

// etcdFlags are the datastore flags shared by the daemon and the routes subcommand.
type etcdFlags struct {
	etcdconfig.Config
	blockPrefix        string
	hostsPrefix        string
	nodename           string
	legacyHostAffinity bool
	poolCIDRs          []string
	ownership          string
}

func (e *etcdFlags) register(fs *pflag.FlagSet) {
	e.Config.BindFlags(fs)
	fs.StringVar(&e.blockPrefix, "block-prefix", calico.BlockPrefix, "etcd prefix of Calico's IPAM blocks (both families)")
	fs.StringVar(&e.hostsPrefix, "hosts-prefix", blockwatch.DefaultHostsPrefix, "etcd prefix where nodes register peer IPs: <prefix><node>/peerip/ipv4/1")
	fs.StringVar(&e.nodename, "nodename", "", "this node's name; else $NODENAME, /var/lib/calico/nodename, the lower-cased hostname")
	fs.BoolVar(&e.legacyHostAffinity, "legacy-host-affinity", true, "treat the pre-2016 block field hostAffinity as the owner when affinity is absent")
	fs.StringSliceVar(&e.poolCIDRs, "pool-cidr", nil, "managed pool CIDR (repeatable); default: the enabled Calico IPPools in etcd")
	fs.StringVar(&e.ownership, "ownership", string(blockwatch.OwnershipBlocks), "where block owners are read from: "+
		"blocks (every block write reaches every node; addresses borrowed from other nodes' blocks are routed), "+
		"affinities (Calico's affinity keys, written only when a block is claimed or released; requires strict affinity, "+
		"else not ready), auto (affinities while the IPAM config has strict_affinity on, else blocks)")
}

// validate checks the flags without opening any connection; lookup gives $ETCD_PASSWORD.
func (e *etcdFlags) validate(lookup func(string) (string, bool)) error {
	if err := e.Config.ReadPassword(lookup); err != nil {
		return err
	}
	if err := e.Config.Validate(); err != nil {
		return err
	}
	for _, p := range []struct{ flag, prefix string }{{"--block-prefix", e.blockPrefix}, {"--hosts-prefix", e.hostsPrefix}} {
		if !strings.HasPrefix(p.prefix, "/") || !strings.HasSuffix(p.prefix, "/") {
			return fmt.Errorf("%s: %q must start and end with '/'", p.flag, p.prefix)
		}
	}
	if _, err := e.pools(); err != nil {
		return err
	}
	if _, err := blockwatch.ParseOwnership(e.ownership); err != nil {
		return fmt.Errorf("--ownership: %w", err)
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

// resolveNodeName applies Calico's order: --nodename/NODENAME (already merged), the file
// /var/lib/calico/nodename, then the lower-cased hostname.
// The name must be usable as one etcd key segment (agent.CheckNodeName).
func resolveNodeName(flagValue, nodenameFile string) (string, error) {
	name, from, err := findNodeName(flagValue, nodenameFile)
	if err != nil {
		return "", err
	}
	if err := agent.CheckNodeName(name); err != nil {
		return "", fmt.Errorf("--nodename (from %s): %w", from, err)
	}
	return name, nil
}

func findNodeName(flagValue, nodenameFile string) (name, from string, err error) {
	if v := strings.TrimSpace(flagValue); v != "" {
		return v, "--nodename or $NODENAME", nil
	}
	if b, err := os.ReadFile(nodenameFile); err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			return v, nodenameFile, nil
		}
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "", "", fmt.Errorf("--nodename: not set and the hostname is unknown: %v", err)
	}
	return strings.ToLower(h), "the hostname", nil
}
