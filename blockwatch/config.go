package blockwatch

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// DefaultHostsPrefix is where agents register their uplink peer IPs: <prefix><node>/peerip/ipv4/1 and
// .../ipv6/1, value a bare IP address.
const DefaultHostsPrefix = "/vpp-calico/hosts/"

// Defaults applied by New to zero Config fields.
const (
	DefaultPageSize       = 1000
	DefaultRequestTimeout = 10 * time.Second
	DefaultProbeInterval  = time.Second
	// DefaultCompactedRelistSpread is Config.CompactedRelistSpread's default.
	DefaultCompactedRelistSpread = 5 * time.Second
)

// Config configures a Watcher. Zero fields take the defaults documented on each field.
type Config struct {
	Client *clientv3.Client
	// BlockPrefix is where Calico's IPAM blocks live; default calico.BlockPrefix
	// ("/calico/ipam/v2/assignment/"), both families. A prefix that does not start with
	// calico.BlockPrefix is taken as a relocated copy of it: keys below it are
	// <BlockPrefix>ipv4/block/<cidr> and <BlockPrefix>ipv6/block/<cidr>.
	BlockPrefix string
	// HostsPrefix is where agents register their peer IPs; default DefaultHostsPrefix.
	HostsPrefix string
	// PoolPrefix is where Calico's v3 IPPool resources live; default calico.IPPoolPrefix.
	PoolPrefix string
	// NodePrefix is where Calico's v3 Node resources live (their addresses and VXLAN tunnel
	// endpoints: Snapshot.Nodes); default calico.NodePrefix.
	NodePrefix string
	// FelixConfigurationPrefix is where Calico's v3 FelixConfigurations live; default
	// calico.FelixConfigurationPrefix. Only "default" and "node.<NodeName>" are read (Snapshot.Tunnel).
	FelixConfigurationPrefix string
	// NodeName is this node's name: its FelixConfiguration override "node.<NodeName>" applies over
	// "default". Empty: only "default" is read.
	NodeName string
	// PageSize is the number of keys per list request; default 1000.
	PageSize int64
	// RequestTimeout bounds every etcd request (and the creation of the watches); default 10s.
	RequestTimeout time.Duration
	// LegacyHostAffinity is passed to calico.OwnerOf: a block with only the pre-2016 hostAffinity
	// field is owned by that node. Logged once per block when it is what made a node the owner.
	LegacyHostAffinity bool
	// ProbeInterval is how long the watch may stay silent before Run probes its stream (opens and
	// cancels one more watch on it: see probeLoop); if the probe is not answered within
	// 2×ProbeInterval, Status reports Synced false and Run lists and watches again on a new stream (so
	// a frozen member is noticed within 3¼×ProbeInterval; a member slow for less than 2×ProbeInterval
	// causes no relist). Default 1s: an idle Watcher opens and cancels one watch a second.
	ProbeInterval time.Duration
	// CompactedRelistSpread bounds the random wait before the relist that follows a compaction (a
	// watch resumed at a revision etcd no longer has), and before the relist that follows a change of
	// the ownership source (OwnershipAuto), per started hundred nodes registered under
	// HostsPrefix (so 25s with 450 nodes). The relist reads at the compaction revision, serializably:
	// the watchers behind one etcd gRPC proxy all learn of a compaction at once, and a spread lets the
	// proxy answer most of their lists from its cache instead of asking etcd once for each, and keeps
	// them from timing out together. The view, and so the routes, stay as they were meanwhile.
	// Default 5s; negative means none.
	CompactedRelistSpread time.Duration
	// Ownership is where block owners are read from (see Ownership): OwnershipBlocks (""), the
	// blocks; OwnershipAffinities, the affinity keys, which requires Calico's strict affinity;
	// OwnershipAuto, the affinities while the IPAM config has strict affinity on, else the blocks.
	Ownership Ownership
	// Logger receives warnings about malformed values and watch errors; nil means slog.Default().
	Logger *slog.Logger
	// Registerer receives the package's metrics (see metrics.go); nil means no metrics.
	Registerer prometheus.Registerer
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.BlockPrefix == "" {
		c.BlockPrefix = calico.BlockPrefix
	}
	if c.HostsPrefix == "" {
		c.HostsPrefix = DefaultHostsPrefix
	}
	if c.PoolPrefix == "" {
		c.PoolPrefix = calico.IPPoolPrefix
	}
	if c.NodePrefix == "" {
		c.NodePrefix = calico.NodePrefix
	}
	if c.FelixConfigurationPrefix == "" {
		c.FelixConfigurationPrefix = calico.FelixConfigurationPrefix
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = DefaultProbeInterval
	}
	if c.CompactedRelistSpread == 0 {
		c.CompactedRelistSpread = DefaultCompactedRelistSpread
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Ownership == "" {
		c.Ownership = OwnershipBlocks
	}
	return c
}

// Validate checks the configuration, with defaults applied to zero fields. It does not require Client
// (so that it can run before any connection is opened); New does.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	prefixes := []struct{ name, value string }{
		{"BlockPrefix", c.BlockPrefix}, {"HostsPrefix", c.HostsPrefix}, {"PoolPrefix", c.PoolPrefix},
		{"NodePrefix", c.NodePrefix}, {"FelixConfigurationPrefix", c.FelixConfigurationPrefix},
	}
	for i, p := range prefixes {
		if !strings.HasPrefix(p.value, "/") || !strings.HasSuffix(p.value, "/") {
			errs = append(errs, fmt.Errorf("%s %q must start and end with \"/\"", p.name, p.value))
		}
		for _, q := range prefixes[i+1:] {
			if strings.HasPrefix(p.value, q.value) || strings.HasPrefix(q.value, p.value) {
				errs = append(errs, fmt.Errorf("%s %q and %s %q overlap", p.name, p.value, q.name, q.value))
			}
		}
	}
	if strings.HasPrefix(calico.BlockPrefix, c.BlockPrefix) && c.BlockPrefix != calico.BlockPrefix {
		errs = append(errs, fmt.Errorf("BlockPrefix %q holds more than Calico's blocks (%q)", c.BlockPrefix, calico.BlockPrefix))
	}
	if strings.HasPrefix(c.BlockPrefix, calico.BlockPrefix) {
		// A sub-prefix of Calico's own (".../assignment/ipv4/") is fine; anything else under it is not.
		if rest := c.BlockPrefix[len(calico.BlockPrefix):]; rest != "" && rest != "ipv4/" && rest != "ipv6/" &&
			rest != "ipv4/block/" && rest != "ipv6/block/" {
			errs = append(errs, fmt.Errorf("BlockPrefix %q is not a family prefix of %q", c.BlockPrefix, calico.BlockPrefix))
		}
	}
	if c.NodeName != "" {
		if k, err := calico.ParseKey(calico.FelixConfigurationKey(calico.FelixConfigurationNodeName(c.NodeName))); err != nil ||
			k.Kind != calico.KindFelixConfiguration {
			errs = append(errs, fmt.Errorf("NodeName %q is not a node name", c.NodeName))
		}
	}
	if _, err := ParseOwnership(string(c.Ownership)); err != nil {
		errs = append(errs, fmt.Errorf("Ownership: %w", err))
	}
	if c.Ownership != OwnershipBlocks {
		// The affinities and the IPAM config are read at Calico's own keys.
		for _, p := range prefixes {
			for _, k := range []string{calico.HostAffinityPrefix, calico.IPAMConfigKey} {
				if strings.HasPrefix(p.value, k) || strings.HasPrefix(k, p.value) {
					errs = append(errs, fmt.Errorf("%s %q overlaps %q, which ownership %s reads", p.name, p.value, k, c.Ownership))
				}
			}
		}
	}
	if c.PageSize < 1 {
		errs = append(errs, fmt.Errorf("PageSize %d must be positive", c.PageSize))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("RequestTimeout %s must be positive", c.RequestTimeout))
	}
	if c.ProbeInterval < 0 {
		errs = append(errs, fmt.Errorf("ProbeInterval %s must be positive", c.ProbeInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("blockwatch config: %w", err)
	}
	return nil
}
