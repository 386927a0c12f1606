package ipamd

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// maxTxnOps stays under etcd's default --max-txn-ops (128).
const maxTxnOps = 100

// blockEntry is a block as known, its mod revision (0 for a block this operation creates), and
// whether the operation changed it.
type blockEntry struct {
	b     *calico.Block
	rev   int64
	dirty bool
	// own: b is this view's copy (the state's blocks are shared until changed).
	own bool
	// created marks a block claimed by this operation (written with its affinity, if absent).
	created bool
	// release marks an empty block of the node whose pool no longer selects it: deleted with its
	// affinity (calico.ReleaseWhenUnselected).
	release bool
}

// edit returns the block for changing, copying it first if it is still the state's.
func (e *blockEntry) edit() *calico.Block {
	if !e.own {
		e.b, e.own = e.b.Clone(), true
	}
	return e.b
}

// affinityEntry is one of the node's affinity keys as known.
type affinityEntry struct {
	state string
	rev   int64
}

// listing is the set of block CIDRs of one family at a revision.
type listing struct {
	rev   int64
	cidrs []netip.Prefix
}

// needs is what a decision could not take without reading more: it is returned as an error, the
// operation reads it, and the decision runs again from the start on the new view.
type needs struct {
	blocks  []netip.Prefix
	listing [2]bool
	family  [2]bool
	keys    []string
	// sources: every source of the node state (its first read, and a lost write's failure branch).
	sources bool
}

func (n *needs) Error() string { return "the decision needs more of the datastore" }

// merge returns what n and o need together (n may be nil).
func (n *needs) merge(o *needs) *needs {
	out := &needs{}
	if n != nil {
		*out = *n
	}
	for _, c := range o.blocks {
		if !slices.Contains(out.blocks, c) {
			out.blocks = append(out.blocks, c)
		}
	}
	for _, k := range o.keys {
		if !slices.Contains(out.keys, k) {
			out.keys = append(out.keys, k)
		}
	}
	for f := range out.listing {
		out.listing[f] = out.listing[f] || o.listing[f]
		out.family[f] = out.family[f] || o.family[f]
	}
	out.sources = out.sources || o.sources
	return out
}

// view is what one attempt of an operation decides on: the node state, and what the operation read
// besides it (the handle, blocks of other nodes, block listings). Deciding changes only the view's
// copies; writes() turns the changes into one conditional transaction. It does no I/O.
type view struct {
	// conf is the operation's request, read what it read besides the state.
	conf *cni.Request
	read *opRead
	// actions are what the decision did that is worth a log line (did): the operation logs them
	// once the write that holds them commits (call.write), so that a decision taken again after a
	// lost race, one whose write fails, and one that writes nothing (STATUS) log nothing.
	actions []action

	// handleView is the handle of the request being decided (see decideBatch; none for GC and
	// STATUS).
	handleView
	// decoded is the state's (maps read only).
	decoded
	// uses are the keys the decision depends on, with their mod revisions (0: absent): the write is
	// conditional on them.
	uses map[string]int64
	// usesReservations: the decision passed over reserved addresses (automatic assignment); the
	// write is conditional on no IPReservation having changed since reservedRev.
	usesReservations bool
	// affinityWrites are changes to the node's affinity keys the write makes besides those of the
	// blocks it creates: confirm a pending affinity of a block it uses, or delete a stale one.
	affinityWrites map[netip.Prefix]calico.AffinityStep
	blocks         map[netip.Prefix]*blockEntry
	// bad holds blocks that exist but cannot be decoded or break Calico's invariants; never written.
	bad map[netip.Prefix]error
	// keyWrites are other keys the write puts (nil: deletes): the handles GC corrects, the affinity
	// of another node's block a release deletes. Their compares are in uses.
	keyWrites map[string][]byte
	// handles are the requests of a batch whose handle the write creates, corrects or deletes,
	// each conditional on what its decision used.
	handles []*request
}

// handleView is what a decision knows of one handle: handleID, whether it was read
// (handleRead), as handle (nil: absent) at handleRev.
type handleView struct {
	handleID   string
	handleRead bool
	handle     *calico.Handle
	handleRev  int64
	// handleGuess, when set, is the exact value the handle is believed to hold (derived from the
	// node's blocks, not read): the write is then conditional on it instead of on handleRev.
	handleGuess []byte
}

// loadHandle returns the handle id as the operation read it (handleRead false when it did not);
// an error when it cannot be decoded.
func loadHandle(read *opRead, id string) (handleView, error) {
	hv := handleView{handleID: id}
	kv, ok := read.keys[calico.HandleKey(id)]
	hv.handleRead = ok
	if kv == nil {
		return hv, nil
	}
	h, err := calico.DecodeHandle(kv.Value)
	if err != nil {
		return hv, withCode(ErrDatastore, "handle %s: %w", id, err)
	}
	// A soft-deleted handle is absent but has a revision.
	hv.handleRev = kv.ModRevision
	if !h.Deleted {
		hv.handle = h
	}
	return hv, nil
}

// newView returns a view of the node state and of what the operation has read.
func newView(s *nodeState, conf *cni.Request, read *opRead) *view {
	v := &view{conf: conf, read: read, decoded: s.decoded, uses: map[string]int64{},
		affinityWrites: map[netip.Prefix]calico.AffinityStep{}, keyWrites: map[string][]byte{},
		blocks: make(map[netip.Prefix]*blockEntry, len(s.blocks)+len(read.blocks)), bad: maps.Clone(s.bad)}
	// The blocks are shared until changed (blockEntry.edit).
	for _, blocks := range []map[netip.Prefix]*blockEntry{read.blocks, s.blocks} {
		for cidr, e := range blocks {
			if e != nil {
				cp := *e
				cp.own = false
				e = &cp
			}
			v.blocks[cidr] = e
		}
	}
	maps.Copy(v.bad, read.bad)
	return v
}

// action is one thing a decision did, as its log line.
type action struct {
	level slog.Level
	msg   string
	args  []any
}

// did records an action of the decision (logged at Info once its write commits).
func (v *view) did(msg string, args ...any) {
	v.actions = append(v.actions, action{level: slog.LevelInfo, msg: msg, args: args})
}

// didWarn records an action that works around bad data in etcd (logged at Warn once its write
// commits).
func (v *view) didWarn(msg string, args ...any) {
	v.actions = append(v.actions, action{level: slog.LevelWarn, msg: msg, args: args})
}

// needHandle is the need for the view's handle.
func (v *view) needHandle() error { return &needs{keys: []string{calico.HandleKey(v.handleID)}} }

// use records that the decision depends on the block cidr's pool and, if the node has one, its
// affinity.
func (v *view) use(cidr netip.Prefix) {
	if p := v.poolOf(cidr); p != nil && p.Name != "" {
		v.uses[calico.IPPoolKey(p.Name)] = v.poolRevs[p.Name]
	}
	if a, ok := v.affinity[cidr]; ok {
		v.uses[calico.HostAffinityKey(v.conf.Node, cidr)] = a.rev
	}
}

// require returns a need for those of cidrs the view does not hold.
func (v *view) require(cidrs ...netip.Prefix) error {
	var todo []netip.Prefix
	for _, c := range cidrs {
		_, loaded := v.blocks[c]
		if _, bad := v.bad[c]; !loaded && !bad && !slices.Contains(todo, c) {
			todo = append(todo, c)
		}
	}
	if len(todo) > 0 {
		return &needs{blocks: todo}
	}
	return nil
}

// keys returns the pairs of keys as read (nil: absent), or a need for those not read.
func (v *view) keys(keys ...string) ([]*kv, error) {
	out := make([]*kv, len(keys))
	n := &needs{}
	for i, k := range keys {
		kv, ok := v.read.keys[k]
		if !ok && !slices.Contains(n.keys, k) {
			n.keys = append(n.keys, k)
		}
		out[i] = kv
	}
	if len(n.keys) > 0 {
		return nil, n
	}
	return out, nil
}

// listing returns the block CIDRs of family f, or a need for them.
func (v *view) listing(f netaddr.Family) (*listing, error) {
	if l := v.read.listings[f]; l != nil {
		return l, nil
	}
	n := &needs{}
	n.listing[f] = true
	return nil, n
}

// requireFamily returns a need for every block of family f unless the operation read them.
func (v *view) requireFamily(f netaddr.Family) error {
	if v.read.family[f] {
		return nil
	}
	n := &needs{}
	n.family[f] = true
	return n
}

// decodeBlockKV decodes a block read under the key of cidr, refusing values that break Calico's
// invariants: block-ipam never writes on top of a block it does not understand. A soft-deleted block
// gives nil.
func decodeBlockKV(cidr netip.Prefix, kv kv) (*blockEntry, error) {
	b, err := calico.DecodeBlock(kv.Value)
	if err != nil {
		return nil, withCode(ErrDatastore, "block %s: %w", cidr, err)
	}
	if b.Deleted {
		return nil, nil
	}
	if b.CIDR != cidr {
		return nil, withCode(ErrDatastore, "block key %s holds cidr %s", calico.BlockKey(cidr), b.CIDR)
	}
	if err := b.Validate(); err != nil {
		return nil, withCode(ErrDatastore, "%w", err)
	}
	return &blockEntry{b: b, rev: kv.ModRevision, own: true}, nil
}

// dirtyCIDRs returns the CIDRs of the blocks this attempt changed, sorted.
func (v *view) dirtyCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for c, e := range v.blocks {
		if e != nil && e.dirty {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// plan is one conditional transaction a decision leads to, and what it writes.
type plan struct {
	cmps []compare
	ops  []op
	// blocks are the changed blocks (nil: deleted), affinity the node's affinity keys written (nil
	// value: deleted), for the state once the write committed.
	blocks   map[netip.Prefix]*blockEntry
	affinity map[string][]byte
	// keys are the other keys written (nil: deleted).
	keys   map[string][]byte
	claims int
}

// writes turns the view's changes into one transaction, conditional on every key the decision used
// being as it knew it: an existing block at its mod revision, a new block and every key of a block
// that would overlap it absent, the pools, affinities, IPAM config and Calico Node resource it
// decided with at their mod revisions (a deleted pool or affinity fails the write), no IPReservation
// created or modified since the state knew them when the decision passed over reserved addresses,
// the handle at its mod revision (or exact value when guessed; absent when not read). A block a
// release left empty and without affinity is deleted instead of written
// (calico.Block.DeleteWhenReleased), and v.affinityWrites confirm or delete affinities. A request's
// newHandle nil or empty deletes its handle.
func (v *view) writes() (*plan, error) {
	p := &plan{blocks: map[netip.Prefix]*blockEntry{}, affinity: map[string][]byte{}}
	used := maps.Clone(v.uses)
	confirmed, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	var overlapping []string
	var ranged [2]bool
	for _, c := range v.dirtyCIDRs() {
		e := v.blocks[c]
		key := calico.BlockKey(c)
		if !e.created && (e.release || e.b.DeleteWhenReleased()) {
			p.cmps = append(p.cmps, modRevisionIs(key, e.rev))
			p.ops = append(p.ops, deleteOp(key))
			p.blocks[c] = nil
			continue
		}
		e.b.BumpSequence()
		data, err := calico.EncodeBlock(e.b)
		if err != nil {
			return nil, fmt.Errorf("encode block %s: %w", c, err)
		}
		p.blocks[c] = e
		if e.created {
			p.cmps = append(p.cmps, absent(key))
			keys, ok := v.overlapKeys(c)
			overlapping = append(overlapping, keys...)
			if f := netaddr.FamilyOf(c.Addr()); !ok && !ranged[f] && v.read.listings[f] != nil {
				ranged[f] = true
				p.cmps = append(p.cmps, noneCreatedSince(calico.BlockPrefix+f.String()+"/block/", v.read.listings[f].rev))
			}
			affKey := calico.HostAffinityKey(v.conf.Node, c)
			used[affKey] = v.affinity[c].rev // 0 (absent) without an affinity
			p.ops = append(p.ops, putOp(affKey, confirmed))
			p.affinity[affKey] = confirmed
			p.claims++
		} else {
			p.cmps = append(p.cmps, modRevisionIs(key, e.rev))
		}
		p.ops = append(p.ops, putOp(key, data))
	}
	for c, step := range v.affinityWrites {
		a, ok := v.affinity[c]
		if e := v.blocks[c]; !ok || (e != nil && e.created) {
			continue
		}
		affKey := calico.HostAffinityKey(v.conf.Node, c)
		used[affKey] = a.rev
		if step == calico.AffinityStale {
			p.ops = append(p.ops, deleteOp(affKey))
			p.affinity[affKey] = nil
		} else {
			p.ops = append(p.ops, putOp(affKey, confirmed))
			p.affinity[affKey] = confirmed
		}
	}
	// The handles written: each conditional on its exact value when guessed, else on its mod
	// revision; an emptied handle is deleted (if it exists).
	keyWrites := maps.Clone(v.keyWrites)
	for _, r := range v.handles {
		key := calico.HandleKey(r.handle)
		if r.hv.handleGuess != nil {
			p.cmps = append(p.cmps, valueIs(key, r.hv.handleGuess))
		} else {
			used[key] = r.hv.handleRev
		}
		switch {
		case r.newHandle != nil && len(r.newHandle.Block) > 0:
			data, err := calico.EncodeHandle(r.newHandle)
			if err != nil {
				return nil, fmt.Errorf("encode handle %s: %w", r.handle, err)
			}
			keyWrites[key] = data
		case r.hv.handleRev != 0 || r.hv.handleGuess != nil:
			keyWrites[key] = nil
		}
	}
	p.keys = keyWrites
	for _, k := range slices.Sorted(maps.Keys(keyWrites)) {
		if val := keyWrites[k]; val == nil {
			p.ops = append(p.ops, deleteOp(k))
		} else {
			p.ops = append(p.ops, putOp(k, val))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(used)) {
		p.cmps = append(p.cmps, modRevisionIs(k, used[k]))
	}
	for _, k := range overlapping {
		if _, ok := used[k]; !ok {
			p.cmps = append(p.cmps, absent(k))
		}
	}
	if v.usesReservations && len(p.blocks) > 0 {
		// A reservation created or changed after the state's copy could cover an address this write
		// hands out; the lost write's failure branch reads them all (sources). A deleted one only
		// frees addresses: deciding without knowing of it is safe, and the range compare does not
		// see it.
		p.cmps = append(p.cmps, noneChangedSince(calico.IPReservationPrefix, v.reservedRev))
	}
	return p, nil
}

// maxOverlapKeys bounds the keys a claim checks for absence one by one; beyond it, the claim is
// conditional on no block of its family having been created since the listing it chose from.
const maxOverlapKeys = 32

// overlapKeys returns the compares that no block of another size in use overlaps the new block c: the
// key of the block of each larger size that would contain c, and of each block of a smaller size
// inside c. The sizes in use are those of the family's pools and of the blocks listed. Beyond
// maxOverlapKeys keys it returns false.
func (v *view) overlapKeys(c netip.Prefix) ([]string, bool) {
	f := netaddr.FamilyOf(c.Addr())
	sizes := map[int]bool{}
	for _, p := range v.pools {
		if netaddr.FamilyOf(p.CIDR.Addr()) == f {
			sizes[p.BlockSize] = true
		}
	}
	if l := v.read.listings[f]; l != nil {
		for _, b := range l.cidrs {
			sizes[b.Bits()] = true
		}
	}
	var keys []string
	for _, bits := range slices.Sorted(maps.Keys(sizes)) {
		switch {
		case bits < c.Bits():
			keys = append(keys, calico.BlockKey(netip.PrefixFrom(c.Addr(), bits).Masked()))
		case bits > c.Bits():
			n := bits - c.Bits()
			if n > 5 || len(keys)+1<<n > maxOverlapKeys {
				return nil, false
			}
			for i := range 1 << n {
				a, _ := calico.OrdinalAddr(c, i<<(c.Addr().BitLen()-bits))
				keys = append(keys, calico.BlockKey(netip.PrefixFrom(a, bits)))
			}
		}
	}
	return keys, true
}

// committed applies a plan that etcd committed at rev to the state: the node's affinity keys and
// blocks it wrote are known at rev.
func (s *nodeState) committed(p *plan, rev int64) {
	changed := false
	for k, val := range p.affinity {
		var v *kv
		if val != nil {
			v = &kv{Key: k, Value: val, ModRevision: rev}
		}
		changed = s.set(srcAffinity, k, v, rev) || changed
	}
	if changed {
		s.decode(srcAffinity)
	}
	for c, e := range p.blocks {
		if s.newer(c, rev) && e != nil {
			s.blocks[c] = &blockEntry{b: e.b, rev: rev}
		}
	}
}
