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
// (one per network), read and written only under that lock: for each family the block the node last
// allocated from (its value and mod revision, and its pool's mod revision), and the list of the
// node's blocks.
//
// It makes the common ADD one etcd round trip: a transaction that assigns from the remembered block,
// conditional on that block, its pool and the handle being exactly as remembered, whose failure branch
// reads the current state, so that a stale cache costs no extra round trip either. The cache never
// decides anything on its own: every write it leads to is conditional on etcd still holding what it
// says, and a missing, corrupt or foreign file is simply ignored.
type nodeCache struct {
	path string
	// Key fingerprints the settings the cache depends on; a different key discards it.
	Key string `json:"key"`
	// Blocks are the node's affine blocks at the last write (hints for the first read).
	Blocks []netip.Prefix `json:"blocks"`
	// Current is the block last allocated from, per family.
	Current [2]*cachedBlock `json:"current"`
}

// cachedBlock is a block as the node last wrote or read it.
type cachedBlock struct {
	CIDR    netip.Prefix    `json:"cidr"`
	Rev     int64           `json:"rev"`
	Value   json.RawMessage `json:"value"`
	Pool    string          `json:"pool,omitempty"` // IPPool name; "" for a pool given as a CIDR only
	PoolRev int64           `json:"poolRev,omitempty"`
}

// maxCachedBlocks bounds the hints read with the first transaction.
const maxCachedBlocks = 32

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
	for _, cb := range nc.Current {
		if cb != nil && !slices.Contains(out, cb.CIDR) {
			out = append(out, cb.CIDR)
		}
	}
	return out
}

// cachedView returns a view holding the remembered current blocks of the given families as if just
// read, with the handle absent, and the pool revisions as extra conditions; nil when the cache lacks
// a block of one of the families (or, with no family required, has none at all).
func (c *call) cachedView(handleID string, families ...Family) *view {
	v := c.emptyView(handleID)
	for _, f := range []Family{V4, V6} {
		cb := c.cache.Current[f]
		if cb == nil {
			if slices.Contains(families, f) {
				return nil
			}
			continue
		}
		b, err := calico.DecodeBlock(cb.Value)
		if err != nil || b.CIDR != cb.CIDR || b.Validate() != nil {
			return nil
		}
		v.blocks[cb.CIDR] = &blockEntry{b: b, rev: cb.Rev}
		if cb.Pool != "" {
			v.extra = append(v.extra, modRevisionIs(calico.IPPoolKey(cb.Pool), cb.PoolRev))
		}
	}
	if len(v.blocks) == 0 {
		return nil
	}
	return v
}

// remember records, after a successful write, the node's blocks and the blocks written, and makes
// the block each family allocated from (used, may be empty) its current block.
func (c *call) remember(v *view, used map[Family]netip.Prefix) {
	nc := c.cache
	if nc.path == "" {
		return
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
		if e != nil && e.rev != 0 && v.ownedByNode(e.b) && !slices.Contains(nc.Blocks, cidr) {
			nc.Blocks = append(nc.Blocks, cidr)
		}
	}
	slices.SortFunc(nc.Blocks, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	nc.Blocks = nc.Blocks[:min(len(nc.Blocks), maxCachedBlocks)]

	for _, f := range []Family{V4, V6} {
		cidr, ok := used[f]
		if !ok {
			// Keep the current block, refreshed if this write changed it.
			if cb := nc.Current[f]; cb != nil {
				cidr = cb.CIDR
			} else {
				continue
			}
		}
		e := v.blocks[cidr]
		if e == nil || !v.ownedByNode(e.b) {
			nc.Current[f] = nil
			continue
		}
		cb := nc.Current[f]
		if cb == nil || cb.CIDR != cidr || e.rev != cb.Rev {
			data := e.encoded
			if data == nil || e.dirty {
				nc.Current[f] = nil
				continue
			}
			pool, poolRev := "", int64(0)
			if cb != nil && cb.CIDR == cidr {
				pool, poolRev = cb.Pool, cb.PoolRev
			}
			for _, p := range v.pools {
				if p.CIDR.Contains(cidr.Addr()) && p.CIDR.Bits() <= cidr.Bits() {
					pool, poolRev = p.Name, v.poolRevs[p.Name]
					break
				}
			}
			nc.Current[f] = &cachedBlock{CIDR: cidr, Rev: e.rev, Value: data, Pool: pool, PoolRev: poolRev}
		}
	}
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
