package ipamd

import (
	"cmp"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// source is one piece of the datastore the node state follows besides blocks: a key or a prefix.
type source int

const (
	srcConfig source = iota
	srcPools
	srcReservations
	srcNode
	srcAffinity
	numSources
)

// nodeState is what the daemon knows of the datastore, owned by the state goroutine: the IPAM config,
// the pools, the IPReservations, the node's Calico Node resource, the node's affinities and their
// blocks. Followers (watch.go), the reads of operations and their committed writes feed it; every
// change arrives with the revision it was true at, and the state keeps, per key, the revision it
// knows the key at: a watch event, a relist, a transaction's read and a write of this daemon may
// arrive in any order, and the newest wins for each key.
type nodeState struct {
	name string
	log  *slog.Logger
	// raw are each source's keys as known; revs the revision each key is known at, present or
	// deleted (a deleted key's entry stays until a read of the whole source covers it); listed the
	// revision of the newest read of the whole source (0: never read), which holds every change up to it.
	raw    [numSources]map[string]kv
	revs   [numSources]map[string]int64
	listed [numSources]int64

	decoded

	// blocks are the blocks of the node's affinities: nil when absent, soft-deleted or unusable (then
	// in bad); blockKnown the revision each is known at. Only blocks of affinities are kept.
	blocks     map[netip.Prefix]*blockEntry
	blockKnown map[netip.Prefix]int64
	bad        map[netip.Prefix]error
	// outside are the blocks outside every pool that were logged (noteOutside).
	outside map[netip.Prefix]struct{}
}

// noteOutside records a block found outside every pool and reports whether it is the first time.
func (s *nodeState) noteOutside(cidr netip.Prefix) bool {
	if _, seen := s.outside[cidr]; seen {
		return false
	}
	if s.outside == nil {
		s.outside = map[netip.Prefix]struct{}{}
	}
	s.outside[cidr] = struct{}{}
	return true
}

func newNodeState(node string, log *slog.Logger) *nodeState {
	s := &nodeState{name: node, log: log, decoded: decoded{cfg: calico.DefaultIPAMConfig(), poolRevs: map[string]int64{},
		affinity: map[netip.Prefix]affinityEntry{}}, blocks: map[netip.Prefix]*blockEntry{},
		blockKnown: map[netip.Prefix]int64{}, bad: map[netip.Prefix]error{}}
	for i := range s.raw {
		s.raw[i], s.revs[i] = map[string]kv{}, map[string]int64{}
	}
	return s
}

// decoded is what the sources say, decoded from their keys; decisions read it (view embeds a copy).
type decoded struct {
	cfg    calico.IPAMConfig
	cfgRev int64 // mod revision of the config key, 0 when absent
	pools  []calico.IPPool
	// poolRevs are the pools' mod revisions by name.
	poolRevs map[string]int64
	// reserved are Calico's IPReservations, never handed out by automatic assignment, as known at
	// reservedRev: every change of a reservation up to it is in reserved (see knownAt).
	reserved    calico.Reservations
	reservedRev int64
	// node is this node's Calico Node resource (for IP pool node selectors; nil when absent), at
	// nodeRev.
	node    *calico.Node
	nodeRev int64
	// affinity are the node's affinities.
	affinity map[netip.Prefix]affinityEntry
	// workload (or workloadErr) and selects are what the pools' selectors say of the node: the pools
	// of automatic assignment per family, and whether each pool selects the node (by name).
	workload    [2][]calico.IPPool
	workloadErr error
	selects     map[string]bool
}

// key returns the key or prefix of a source.
func (s *nodeState) key(src source) (key string, prefix bool) {
	switch src {
	case srcConfig:
		return calico.IPAMConfigKey, false
	case srcPools:
		return calico.IPPoolPrefix, true
	case srcReservations:
		return calico.IPReservationPrefix, true
	case srcNode:
		return calico.NodeKey(s.name), false
	default:
		return calico.HostAffinityNodePrefix(s.name), true
	}
}

// allListed reports whether every source has been read once.
func (s *nodeState) allListed() bool {
	return !slices.Contains(s.listed[:], 0)
}

// synced reports whether every source and the block of every affinity have been read.
func (s *nodeState) synced() bool {
	return s.allListed() && len(s.missingBlocks()) == 0
}

// missingBlocks returns the affinities whose block has not been read, sorted.
func (s *nodeState) missingBlocks() []netip.Prefix {
	var out []netip.Prefix
	for cidr := range s.affinity {
		if s.blockKnown[cidr] == 0 {
			out = append(out, cidr)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// event applies changes of a source (a deletion when Deleted).
func (s *nodeState) event(src source, events []kvEvent) {
	changed := false
	for _, e := range events {
		v := &e.KV
		if e.Deleted {
			v = nil
		}
		changed = s.set(src, e.KV.Key, v, e.Rev) || changed
	}
	if changed {
		s.decode(src)
	}
}

// setBlock records the block cidr as read at rev (kv nil: absent), if it is one of the node's
// affinities and rev is newer than what is known.
func (s *nodeState) setBlock(cidr netip.Prefix, kv *kv, rev int64) {
	if !s.newer(cidr, rev) || kv == nil {
		return
	}
	e, err := decodeBlockKV(cidr, *kv)
	if err != nil {
		s.bad[cidr] = err
		s.log.Warn("cannot use block", "cidr", cidr, "err", err)
		return
	}
	s.blocks[cidr] = e
}

// decode rebuilds the decoded form of a source from its keys.
func (s *nodeState) decode(src source) {
	s.decodeSource(src)
	if src == srcPools || src == srcNode {
		s.workloadErr = nil
		for f := range s.workload {
			pools, err := calico.WorkloadPools(s.pools, netaddr.Family(f) == netaddr.V6, s.node)
			s.workload[f] = pools
			s.workloadErr = cmp.Or(s.workloadErr, err)
		}
		s.selects = make(map[string]bool, len(s.pools))
		for _, p := range s.pools {
			ok, err := p.SelectsNode(s.node)
			s.selects[p.Name] = ok && err == nil
		}
	}
}

func (s *nodeState) decodeSource(src source) {
	switch src {
	case srcConfig:
		s.cfg, s.cfgRev = calico.DefaultIPAMConfig(), 0
		for _, kv := range s.raw[src] {
			c, err := calico.DecodeIPAMConfig(kv.Value)
			if err != nil {
				// The default stays in force; the write conditions still check the key.
				s.log.Warn("ignoring undecodable IPAM config", "key", kv.Key, "err", err)
			} else {
				s.cfg = c
			}
			s.cfgRev = kv.ModRevision
		}
	case srcPools:
		s.pools, s.poolRevs = nil, map[string]int64{}
		for _, k := range slices.Sorted(maps.Keys(s.raw[src])) {
			kv := s.raw[src][k]
			p, err := calico.DecodeIPPool(kv.Value)
			if err != nil {
				s.log.Warn("ignoring undecodable IP pool", "key", kv.Key, "err", err)
				continue
			}
			p.Name = strings.TrimPrefix(kv.Key, calico.IPPoolPrefix)
			s.pools = append(s.pools, p)
			s.poolRevs[p.Name] = kv.ModRevision
		}
	case srcReservations:
		s.reserved, s.reservedRev = nil, s.knownAt(src)
		for _, k := range slices.Sorted(maps.Keys(s.raw[src])) {
			rs, err := calico.DecodeIPReservation(s.raw[src][k].Value)
			if err != nil {
				s.log.Warn("ignoring undecodable IPReservation entries", "key", k, "err", err)
			}
			s.reserved = append(s.reserved, rs...)
		}
	case srcNode:
		s.node, s.nodeRev = nil, 0
		for _, kv := range s.raw[src] {
			s.nodeRev = kv.ModRevision
			n, err := calico.DecodeNode(kv.Value)
			if err != nil {
				// Pools with node selectors then select nothing; those for every node still serve.
				s.log.Warn("ignoring undecodable Calico Node resource", "key", kv.Key, "err", err)
				continue
			}
			s.node = &n
		}
	case srcAffinity:
		s.affinity = map[netip.Prefix]affinityEntry{}
		for _, kv := range s.raw[src] {
			k, err := calico.ParseKey(kv.Key)
			if err != nil || k.Kind != calico.KindHostAffinity || k.Name != s.name {
				continue
			}
			a, err := calico.DecodeAffinity(kv.Value)
			if err != nil {
				s.log.Warn("ignoring undecodable affinity", "key", kv.Key, "err", err)
				continue
			}
			if a.Deleted {
				a.State = calico.AffinityPendingDeletion
			}
			s.affinity[k.CIDR] = affinityEntry{state: a.State, rev: kv.ModRevision}
		}
		// Only the blocks of affinities are followed.
		for cidr := range s.blockKnown {
			if _, ok := s.affinity[cidr]; !ok {
				delete(s.blocks, cidr)
				delete(s.blockKnown, cidr)
				delete(s.bad, cidr)
			}
		}
	}
}
