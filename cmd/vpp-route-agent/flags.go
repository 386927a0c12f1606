package main

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/spf13/pflag"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/flagenv"
)

// flagEnv names the agent's environment fall-backs: Calico's names, else VPP_ROUTE_AGENT_<FLAG>
// (--table-id falls back to VPP_ROUTE_AGENT_TABLE_ID).
var flagEnv = flagenv.Env{Prefix: "VPP_ROUTE_AGENT_", Calico: etcdconfig.CalicoEnv}

// parseWithEnv documents the environment fall-backs in the usage, parses args and applies the
// environment to the flags not given; errors are usage errors.
func parseWithEnv(fs *pflag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	flagEnv.Annotate(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if err := flagEnv.Apply(fs, lookup); err != nil {
		return usageError{err}
	}
	return nil
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
