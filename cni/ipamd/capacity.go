package ipamd

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultCapacityInterval is how often the capacity gauges are read again from etcd.
const DefaultCapacityInterval = 30 * time.Second

// DefaultHostsPrefix is where the route agents register (the agent's --hosts-prefix default): a node
// with a key there, or an IPAM liveness key, is alive.
const DefaultHostsPrefix = "/vpp-calico/hosts/"

// CapacityConfig configures the capacity gauges.
type CapacityConfig struct {
	Client *clientv3.Client
	Node   string
	// Leader reports whether this daemon exports the cluster-wide gauges (Liveness.Leader); nil:
	// never.
	Leader func() bool
	// Interval between reads (default DefaultCapacityInterval); CallTimeout bounds each etcd call.
	Interval, CallTimeout time.Duration
	// HostsPrefix is the route agents' registration prefix (default DefaultHostsPrefix).
	HostsPrefix string
	// Exclude returns the address ranges the CNI configuration excludes (Server.Exclude), counted as
	// reserved; nil: none. Only requests carry them, and every node has the same network
	// configuration as a rule: the elected daemon counts its own node's for the pools.
	Exclude func() []netip.Prefix
	Logger  *slog.Logger
}

// Capacity exports the IPAM capacity (calico.Capacity) as gauges: every daemon its own node's, the
// elected one the cluster's. A daemon that does not lead exports none of the cluster's series, so a
// sum over every daemon's series is the cluster's figure. Labels are pool, family, and node for the
// node's own gauges: bounded by the configuration, never by the number of pods.
//
// The leader reads every pool, block, IPReservation, the IPAM config and who is alive, at one
// revision; the others read the pools, the config and their own blocks only.
type Capacity struct {
	cfg CapacityConfig

	mu   sync.Mutex // guards snap and skipped
	snap capacitySnap
	// readMu serialises reads; decoded are the blocks the last read decoded, by key, with the mod
	// revision they were decoded at: a block unchanged since is not decoded again (at 100,000 blocks
	// decoding is most of a read: BenchmarkCapacity100k).
	readMu  sync.Mutex
	decoded map[string]decodedBlock
	// skipped are the keys whose values could not be decoded, each logged once.
	skipped map[string]bool

	readErrors prometheus.Counter
}

// capacitySnap is one read's result. full: read as the leader (pool figures are the cluster's).
type capacitySnap struct {
	rep       calico.CapacityReport
	full      bool
	at        time.Time
	deadNodes int
	deadAddrs map[string]float64 // pool -> allocated addresses in blocks of dead nodes
	skipped   int
}

var (
	poolLabels = []string{"pool", "family"}
	nodeLabels = []string{"node", "pool", "family"}

	descPoolAddresses = prometheus.NewDesc("block_ipam_pool_addresses", "Addresses in the IP pool (calicoctl ipam show: IPS TOTAL). Exported by the elected daemon only.", poolLabels, nil)
	descPoolBlockAddr = prometheus.NewDesc("block_ipam_pool_block_addresses", "Addresses of the pool's claimed blocks. Exported by the elected daemon only.", poolLabels, nil)
	descPoolAllocated = prometheus.NewDesc("block_ipam_pool_allocated_addresses", "Allocated addresses in the pool (calicoctl ipam show: IPS IN USE). Exported by the elected daemon only.", poolLabels, nil)
	descPoolFree      = prometheus.NewDesc("block_ipam_pool_free_block_addresses", "Addresses of claimed blocks neither allocated nor reserved. Exported by the elected daemon only.", poolLabels, nil)
	descPoolReserved  = prometheus.NewDesc("block_ipam_pool_reserved_addresses", "Addresses of the pool that IPReservations or the CNI configuration's ipam.exclude (as of the last ADD this daemon served) cover. Exported by the elected daemon only.", poolLabels, nil)
	descPoolBlocks    = prometheus.NewDesc("block_ipam_pool_blocks", "Claimed blocks of the pool. Exported by the elected daemon only.", poolLabels, nil)
	descPoolClaimable = prometheus.NewDesc("block_ipam_pool_claimable_blocks", "Block-sized subnets of the pool a claim could still take. Exported by the elected daemon only.", poolLabels, nil)
	descPoolBorrowed  = prometheus.NewDesc("block_ipam_pool_borrowed_addresses", "Allocated addresses whose node is not their block's owner. Exported by the elected daemon only.", poolLabels, nil)
	descDeadAddrs     = prometheus.NewDesc("block_ipam_pool_dead_node_addresses", "Allocated addresses in blocks of nodes with neither an IPAM liveness key nor a route agent registration. Exported by the elected daemon only.", poolLabels, nil)
	descDeadNodes     = prometheus.NewDesc("block_ipam_dead_nodes", "Nodes holding blocks with neither an IPAM liveness key nor a route agent registration. Exported by the elected daemon only.", nil, nil)
	descOutside       = prometheus.NewDesc("block_ipam_blocks_outside_pools", "Blocks in no IP pool. Exported by the elected daemon only.", nil, nil)

	descNodeBlocks    = prometheus.NewDesc("block_ipam_node_blocks", "Blocks this node holds (host affinity), by pool.", nodeLabels, nil)
	descNodeAllocated = prometheus.NewDesc("block_ipam_node_allocated_addresses", "Allocated addresses in this node's blocks, by pool.", nodeLabels, nil)
	descNodeFree      = prometheus.NewDesc("block_ipam_node_free_addresses", "Free, unreserved addresses in this node's blocks, by pool.", nodeLabels, nil)
	descNodeLimit     = prometheus.NewDesc("block_ipam_node_block_limit", "Blocks a node may hold per family (the IPAM config's maxBlocksPerHost, 20 when unset).", []string{"node"}, nil)
	descAutoAllocate  = prometheus.NewDesc("block_ipam_auto_allocate_blocks", "1 when the IPAM config lets nodes claim blocks (auto_allocate_blocks).", []string{"node"}, nil)
	descExporter      = prometheus.NewDesc("block_ipam_capacity_exporter", "1 on the daemon that exports the cluster-wide capacity gauges (elected), else 0.", []string{"node"}, nil)
	descUpdated       = prometheus.NewDesc("block_ipam_capacity_updated_timestamp_seconds", "When the capacity gauges were last read from etcd (Unix time).", []string{"node"}, nil)
	descSkipped       = prometheus.NewDesc("block_ipam_capacity_skipped_values", "Values the last capacity read could not decode and left out (logged once per key).", []string{"node"}, nil)
)

// NewCapacity returns the capacity gauges and registers them with reg (nil: not registered).
func NewCapacity(cfg CapacityConfig, reg prometheus.Registerer) *Capacity {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultCapacityInterval
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	if cfg.HostsPrefix == "" {
		cfg.HostsPrefix = DefaultHostsPrefix
	}
	if cfg.Leader == nil {
		cfg.Leader = func() bool { return false }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Capacity{cfg: cfg, skipped: map[string]bool{},
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "block_ipam_capacity_read_errors_total",
			Help: "Capacity reads from etcd that failed (the gauges keep the last read's values).",
		})}
	if reg != nil {
		reg.MustRegister(c, c.readErrors)
	}
	return c
}

// Run reads the capacity every Interval until ctx ends, and at once when the daemon becomes the
// leader (checked every second), so that a new leader exports within a second of its election.
func (c *Capacity) Run(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last time.Time
	// tried: the leadership of the last read, which a change of leadership makes stale at once (a
	// read that failed is retried at the next interval, not every second while etcd is down).
	tried := false
	for {
		leader := c.cfg.Leader()
		if last.IsZero() || time.Since(last) >= c.cfg.Interval || leader != tried {
			last, tried = time.Now(), leader
			if err := c.Refresh(ctx, leader); err != nil && ctx.Err() == nil {
				c.readErrors.Inc()
				c.cfg.Logger.Warn("read IPAM capacity", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Refresh reads the capacity once: the whole cluster's when full, else the node's own.
func (c *Capacity) Refresh(ctx context.Context, full bool) error {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	in, alive, rev, err := c.read(ctx, full)
	if err != nil {
		return err
	}
	if c.cfg.Exclude != nil {
		in.Exclude = c.cfg.Exclude()
	}
	snap := capacitySnap{rep: calico.Capacity(in.CapacityInput), full: full, at: time.Now(), skipped: in.skipped}
	if full {
		snap.deadAddrs = map[string]float64{}
		dead := map[string]bool{}
		for _, b := range in.Blocks {
			o := calico.OwnerOf(b, false)
			if o.Kind != calico.OwnerHost || alive[o.Node] || b.Deleted {
				continue
			}
			for _, p := range in.Pools {
				if p.Contains(b.CIDR) {
					n := 0
					for _, a := range b.Allocations {
						if a != nil {
							n++
						}
					}
					snap.deadAddrs[p.Name] += float64(n)
					dead[o.Node] = true
					break
				}
			}
		}
		snap.deadNodes = len(dead)
	}
	c.mu.Lock()
	c.snap = snap
	c.mu.Unlock()
	c.cfg.Logger.Debug("read IPAM capacity", "full", full, "revision", rev, "blocks", len(in.Blocks))
	return nil
}

// decodedBlock is a block value as decoded at mod revision rev.
type decodedBlock struct {
	rev   int64
	block *calico.Block
}

// capacityRead is what one read found.
type capacityRead struct {
	calico.CapacityInput
	skipped int
}

// read reads the input of calico.Capacity at one revision, and (full) the nodes that are alive.
func (c *Capacity) read(ctx context.Context, full bool) (capacityRead, map[string]bool, int64, error) {
	var in capacityRead
	in.Config = calico.DefaultIPAMConfig()
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	resp, err := c.cfg.Client.Get(cctx, calico.IPAMConfigKey)
	cancel()
	if err != nil {
		return in, nil, 0, fmt.Errorf("read %s: %w", calico.IPAMConfigKey, err)
	}
	rev := resp.Header.Revision
	for _, kv := range resp.Kvs {
		if conf, err := calico.DecodeIPAMConfig(kv.Value); err != nil {
			c.skip(&in, string(kv.Key), err)
		} else {
			in.Config = conf
		}
	}
	each := func(prefix string, keysOnly bool, fn func(key string, value []byte)) error {
		return c.list(ctx, prefix, rev, keysOnly, func(kv *mvccpb.KeyValue) { fn(string(kv.Key), kv.Value) })
	}
	if err := each(calico.IPPoolPrefix, false, func(key string, v []byte) {
		if p, err := calico.DecodeIPPool(v); err != nil {
			c.skip(&in, key, err)
		} else {
			in.Pools = append(in.Pools, p)
		}
	}); err != nil {
		return in, nil, 0, err
	}
	if err := each(calico.IPReservationPrefix, false, func(key string, v []byte) {
		r, err := calico.DecodeIPReservation(v)
		if err != nil {
			c.skip(&in, key, err)
		}
		in.Reservations = append(in.Reservations, r...)
	}); err != nil {
		return in, nil, 0, err
	}
	decoded := make(map[string]decodedBlock, len(c.decoded))
	block := func(kv *mvccpb.KeyValue) {
		key := string(kv.Key)
		if d, ok := c.decoded[key]; ok && d.rev == kv.ModRevision {
			decoded[key] = d
			in.Blocks = append(in.Blocks, d.block)
			return
		}
		if b, err := calico.DecodeBlock(kv.Value); err != nil {
			c.skip(&in, key, err)
		} else {
			decoded[key] = decodedBlock{rev: kv.ModRevision, block: b}
			in.Blocks = append(in.Blocks, b)
		}
	}
	if !full {
		// The node's blocks, by its affinity keys.
		var keys []string
		if err := each(calico.HostAffinityNodePrefix(c.cfg.Node), true, func(key string, _ []byte) {
			if k, err := calico.ParseKey(key); err == nil && k.Kind == calico.KindHostAffinity {
				keys = append(keys, calico.BlockKey(k.CIDR))
			}
		}); err != nil {
			return in, nil, 0, err
		}
		for start := 0; start < len(keys); start += maxTxnOps {
			var ops []clientv3.Op
			for _, k := range keys[start:min(start+maxTxnOps, len(keys))] {
				ops = append(ops, clientv3.OpGet(k, clientv3.WithRev(rev)))
			}
			cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
			tr, err := c.cfg.Client.Txn(cctx).Then(ops...).Commit()
			cancel()
			if err != nil {
				return in, nil, 0, fmt.Errorf("read the node's blocks: %w", err)
			}
			for _, r := range tr.Responses {
				for _, kv := range r.GetResponseRange().Kvs {
					block(kv)
				}
			}
		}
		c.decoded = decoded
		return in, nil, rev, nil
	}
	if err := c.list(ctx, calico.BlockPrefix, rev, false, block); err != nil {
		return in, nil, 0, err
	}
	c.decoded = decoded
	alive := map[string]bool{}
	for _, prefix := range []string{AlivePrefix, c.cfg.HostsPrefix} {
		if err := each(prefix, true, func(key string, _ []byte) {
			node, _, _ := strings.Cut(strings.TrimPrefix(key, prefix), "/")
			alive[node] = true
		}); err != nil {
			return in, nil, 0, err
		}
	}
	return in, alive, rev, nil
}

// listPage is how many keys one range read returns. etcd counts every key left in the range for each
// page, so small pages cost the square of the blocks: at 100,000 blocks pages of 500 spent 4.5 s of the
// read in etcd's index, pages of 5,000 a tenth of that (BenchmarkCapacity100k).
const listPage = 5000

// list calls fn for every key under prefix at revision rev, reading it in pages.
func (c *Capacity) list(ctx context.Context, prefix string, rev int64, keysOnly bool, fn func(kv *mvccpb.KeyValue)) error {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(listPage)}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
		resp, err := c.cfg.Client.Get(cctx, from, opts...)
		cancel()
		if err != nil {
			return fmt.Errorf("list %s at revision %d: %w", prefix, rev, err)
		}
		for _, kv := range resp.Kvs {
			fn(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// skip counts a value that does not decode, logging it the first time.
func (c *Capacity) skip(in *capacityRead, key string, err error) {
	in.skipped++
	c.mu.Lock()
	first := !c.skipped[key]
	c.skipped[key] = true
	c.mu.Unlock()
	if first {
		c.cfg.Logger.Warn("capacity: leaving out a value that does not decode", "key", key, "err", err)
	}
}

// Describe sends nothing: the collector is unchecked, since the series it exports depend on
// whether the daemon leads.
func (c *Capacity) Describe(chan<- *prometheus.Desc) {}

// Collect sends the node's gauges, and the cluster's when this daemon leads and has read them.
func (c *Capacity) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	s := c.snap
	c.mu.Unlock()
	node := c.cfg.Node
	leader := c.cfg.Leader()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descExporter, b2f(leader && s.full), node)
	if s.at.IsZero() {
		return
	}
	gauge(descUpdated, float64(s.at.UnixNano())/1e9, node)
	gauge(descSkipped, float64(s.skipped), node)
	gauge(descNodeLimit, float64(s.rep.BlockLimit), node)
	// The config as read; the report does not carry it.
	gauge(descAutoAllocate, b2f(s.rep.AutoAllocate), node)
	own := map[string]calico.NodeCapacity{}
	for _, n := range s.rep.Nodes {
		if n.Node == node {
			own[n.Pool] = n
		}
	}
	for _, p := range s.rep.Pools {
		n := own[p.Pool]
		gauge(descNodeBlocks, float64(n.Blocks), node, p.Pool, p.Family)
		gauge(descNodeAllocated, float64(n.Allocated), node, p.Pool, p.Family)
		gauge(descNodeFree, float64(n.Free), node, p.Pool, p.Family)
	}
	if !leader || !s.full {
		return
	}
	for _, p := range s.rep.Pools {
		l := []string{p.Pool, p.Family}
		gauge(descPoolAddresses, p.Addresses, l...)
		gauge(descPoolBlockAddr, p.BlockAddresses, l...)
		gauge(descPoolAllocated, p.Allocated, l...)
		gauge(descPoolFree, p.FreeInBlocks, l...)
		gauge(descPoolReserved, p.Reserved, l...)
		gauge(descPoolBlocks, p.BlocksClaimed, l...)
		gauge(descPoolClaimable, p.BlocksClaimable, l...)
		gauge(descPoolBorrowed, p.Borrowed, l...)
		gauge(descDeadAddrs, s.deadAddrs[p.Pool], l...)
	}
	gauge(descDeadNodes, float64(s.deadNodes))
	gauge(descOutside, float64(s.rep.BlocksOutside))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
