package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// nodeCache is what block-ipam remembers on the node between calls, in a file beside the node lock
// (one per network), read and written only under that lock: the node's blocks, the values of up to
// maxCachedValues of them as last written or read (with mod revisions, and their pools' revisions),
// and for each family the block ADD assigns from next.
//
// It makes the common ADD and DEL one etcd round trip each: ADD assigns from the remembered block in a
// transaction conditional on that block, its pool and the handle being exactly as remembered; DEL
// derives the handle's value from the remembered blocks and writes conditional on that exact value.
// The failure branch of either transaction reads the current state, so that a stale cache costs no
// extra round trip. The cache never decides anything on its own: every write it leads to is
// conditional on etcd still holding what it says, and a missing, corrupt or foreign file is ignored.
type nodeCache struct {
	path string
	// Key fingerprints the settings the cache depends on; a different key discards it.
	Key string `json:"key"`
	// Blocks are the node's affine blocks at the last write (hints for the first read).
	Blocks []netip.Prefix `json:"blocks"`
	// Values are blocks of the node as last written or read.
	Values []*cachedBlock `json:"values"`
	// Current is the block ADD assigns from next, per family (one of Values; invalid when none).
	Current [2]netip.Prefix `json:"current"`
	// Reserved are the IPReservations as of ReadRev, the revision of the last full read. ADD's
	// write from the cache is conditional on no reservation, no affinity of the node and not the
	// node's Calico Node resource having changed since: a new reservation must be honoured, an
	// affinity Calico left pending adopted, and a pool no longer selecting the node left alone.
	Reserved calico.Reservations `json:"reserved,omitempty"`
	ReadRev  int64               `json:"readRev,omitempty"`
}

// cachedBlock is a block as the node last wrote or read it.
type cachedBlock struct {
	CIDR    netip.Prefix    `json:"cidr"`
	Rev     int64           `json:"rev"`
	Value   json.RawMessage `json:"value"`
	Pool    string          `json:"pool,omitempty"` // IPPool name; "" for a pool given as a CIDR only
	PoolRev int64           `json:"poolRev,omitempty"`
}

// Bounds of the cache: the blocks hinted for the first read, and the block values kept (a node
// rarely has more than a few blocks).
const (
	maxCachedBlocks = 32
	maxCachedValues = 8
)

// cachePath is the cache file of a network beside the lock file; "" (no lock) means no cache.
func cachePath(lockFile, network string) string {
	if lockFile == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(lockFile), filepath.Base(lockFile)+"."+network+".cache")
}

// cacheKey fingerprints what the cached state depends on besides etcd: the node, the etcd endpoints
// and the configured pools.
func (c *Config) cacheKey() string {
	return fmt.Sprintf("v1|%s|%v|%v", c.Node, c.Endpoints, c.Pools)
}

// loadCache reads the cache; any problem gives an empty cache.
func loadCache(path, key string) *nodeCache {
	nc := &nodeCache{path: path, Key: key}
	if path == "" {
		return nc
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nc
	}
	var read nodeCache
	if json.Unmarshal(data, &read) != nil || read.Key != key {
		return nc
	}
	read.path = path
	return &read
}

// save writes the cache over the old one in place (write at offset 0, then truncate to the new
// length): on ext4 both O_TRUNC and rename-over-existing force a data flush, which cost ~1 ms here.
// A writer killed half-way leaves a file that does not parse, which loadCache ignores. Errors only
// cost the next call a round trip.
func (nc *nodeCache) save() error {
	if nc.path == "" {
		return nil
	}
	data, err := json.Marshal(nc)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(nc.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteAt(data, 0)
	terr := f.Truncate(int64(len(data)))
	cerr := f.Close()
	return errors.Join(werr, terr, cerr)
}

// hint returns the blocks to read with the first transaction.
func (nc *nodeCache) hint() []netip.Prefix {
	out := slices.Clone(nc.Blocks)
	for _, cb := range nc.Values {
		if !slices.Contains(out, cb.CIDR) {
			out = append(out, cb.CIDR)
		}
	}
	return out
}

// value returns the remembered value of a block, nil when there is none.
func (nc *nodeCache) value(cidr netip.Prefix) *cachedBlock {
	for _, cb := range nc.Values {
		if cb.CIDR == cidr {
			return cb
		}
	}
	return nil
}

// cachedView returns a view holding remembered blocks as if just read, with the handle absent; nil
// when the cache has nothing usable. For ADD (forAdd) it holds the current block of every family ADD
// assigns, and their pools' revisions are extra conditions of the write; for DEL every remembered
// block.
func (c *call) cachedView(handleID string, forAdd bool) *view {
	v := c.emptyView(handleID)
	var use []*cachedBlock
	if forAdd {
		for _, f := range c.conf.families() {
			cb := c.cache.value(c.cache.Current[f])
			if cb == nil {
				return nil
			}
			use = append(use, cb)
			if cb.Pool != "" {
				v.extra = append(v.extra, modRevisionIs(calico.IPPoolKey(cb.Pool), cb.PoolRev))
			}
		}
		v.reserved = c.cache.Reserved
		v.extra = append(v.extra, v.resourcesUnchanged(c.cache.ReadRev)...)
	} else {
		use = c.cache.Values
	}
	for _, cb := range use {
		b, err := calico.DecodeBlock(cb.Value)
		if err != nil || b.CIDR != cb.CIDR || b.Validate() != nil {
			return nil
		}
		v.blocks[cb.CIDR] = &blockEntry{b: b, rev: cb.Rev, encoded: cb.Value}
	}
	if len(v.blocks) == 0 {
		return nil
	}
	return v
}

// remember records, after a successful write, the node's blocks and the values of those of its blocks
// the view holds, and makes the block each family allocated from (used, may be empty) its current
// block.
func (c *call) remember(v *view, used map[Family]netip.Prefix) {
	nc := c.cache
	if nc.path == "" {
		return
	}
	if v.resourcesRead && v.readRev >= nc.ReadRev {
		nc.Reserved, nc.ReadRev = v.reserved, v.readRev
	}
	if len(v.affinity) > 0 {
		nc.Blocks = nc.Blocks[:0]
		for cidr, a := range v.affinity {
			if a.state == calico.AffinityConfirmed {
				nc.Blocks = append(nc.Blocks, cidr)
			}
		}
	}
	for cidr, e := range v.blocks {
		mine := e != nil && v.ownedByNode(e.b)
		if !mine {
			nc.Values = slices.DeleteFunc(nc.Values, func(cb *cachedBlock) bool { return cb.CIDR == cidr })
			continue
		}
		if e.rev == 0 || e.dirty || e.encoded == nil {
			continue
		}
		if !slices.Contains(nc.Blocks, cidr) {
			nc.Blocks = append(nc.Blocks, cidr)
		}
		cb := nc.value(cidr)
		if cb == nil {
			cb = &cachedBlock{CIDR: cidr}
			nc.Values = append(nc.Values, cb)
		}
		if e.rev >= cb.Rev {
			cb.Rev, cb.Value = e.rev, e.encoded
		}
		for _, p := range v.pools {
			if p.CIDR.Contains(cidr.Addr()) && p.CIDR.Bits() <= cidr.Bits() {
				cb.Pool, cb.PoolRev = p.Name, v.poolRevs[p.Name]
				break
			}
		}
	}
	slices.SortFunc(nc.Blocks, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	nc.Blocks = nc.Blocks[:min(len(nc.Blocks), maxCachedBlocks)]
	for _, f := range []Family{V4, V6} {
		if cidr, ok := used[f]; ok {
			nc.Current[f] = cidr
		}
		if nc.value(nc.Current[f]) == nil {
			nc.Current[f] = netip.Prefix{}
		}
	}
	// Keep the current blocks and the most recently written others.
	slices.SortFunc(nc.Values, func(a, b *cachedBlock) int {
		ac, bc := a.CIDR == nc.Current[V4] || a.CIDR == nc.Current[V6], b.CIDR == nc.Current[V4] || b.CIDR == nc.Current[V6]
		if ac != bc {
			if ac {
				return -1
			}
			return 1
		}
		return int(b.Rev - a.Rev)
	})
	nc.Values = nc.Values[:min(len(nc.Values), maxCachedValues)]
	if err := nc.save(); err != nil {
		c.log.Warn("cannot save the node cache", "path", nc.path, "err", err)
	}
}

// forget drops the cache (after GC, which rewrites blocks in bulk).
func (c *call) forget() {
	if c.cache.path != "" {
		os.Remove(c.cache.path)
		c.cache = &nodeCache{path: c.cache.path, Key: c.cache.Key}
	}
}
