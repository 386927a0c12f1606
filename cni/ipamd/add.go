package ipamd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// add decides an ADD (a decision of a batch, see serve). The leader is decided in full: the
// addresses its container already holds on this interface, or new ones, from the node's blocks,
// claiming or borrowing as Calico would (decideAdd). An ADD queued behind it is served only from the
// node's blocks with room (addQueued).
//
// Steady state, one etcd round trip: the decision is taken on the node state the followers keep, with
// the handle assumed absent, and written in one transaction conditional on everything it used. When
// the transaction loses (the handle exists, or the state was behind), its failure branch reads the
// state's sources, the handles and the blocks, and the next attempt decides on that. Claiming a block
// adds a keys-only listing of the family's blocks; borrowing reads the family's blocks. The handle is
// read first when the node's blocks show the container's addresses (a repeated ADD, or a second
// interface) and when an address is requested. A refusal is answered only once it holds on what
// this operation read at a current revision (recheck): a success is checked by the write's
// conditions, a refusal by nothing else, and the state may lag behind etcd.
func (v *view) add(r *request, lead bool) error {
	if !lead {
		return v.addQueued(r)
	}
	if !v.handleRead && (len(v.conf.RequestedIPs) > 0 || v.holdsAny(r.handle)) {
		return v.needHandle()
	}
	got, held, err := v.decideAdd(r.handle, r.ifname, r.attr)
	if err != nil {
		return v.recheck(err)
	}
	r.allocs = got
	if !held {
		r.changed, r.newHandle = true, handleWith(v.handle, got)
	}
	return nil
}

// holdsAny reports whether any block of the view holds an address of the handle.
func (v *view) holdsAny(handle string) bool {
	for _, e := range v.blocks {
		if e != nil && len(e.b.Ordinals(func(a *calico.AllocationAttribute) bool { return a.HeldBy(handle) })) > 0 {
			return true
		}
	}
	return false
}

func (v *view) decideAdd(handle, ifname string, attr calico.AllocationAttribute) (got []allocation, held bool, err error) {
	// The pools ADD selects depend on the IPAM config and the Node resource's labels.
	v.uses[calico.IPAMConfigKey], v.uses[calico.NodeKey(v.conf.Node)] = v.cfgRev, v.nodeRev
	auto, err := v.selectPools(true)
	if err != nil {
		return nil, false, err
	}
	if err := v.require(handleBlocks(v.handle)...); err != nil {
		return nil, false, err
	}
	if h := v.held(handle, ifname); len(h) > 0 {
		return h, true, nil
	}
	if len(v.conf.RequestedIPs) > 0 {
		all, err := v.selectPools(false)
		if err != nil {
			return nil, false, err
		}
		for _, ip := range v.conf.RequestedIPs {
			a, err := v.assignSpecific(all[netaddr.FamilyOf(ip)], ip, attr)
			if err != nil {
				return nil, false, err
			}
			got = append(got, a)
		}
	} else {
		v.usesReservations = true
		unselected := v.unselected(auto)
		for _, f := range v.conf.Families() {
			a, err := v.assignAuto(f, auto[f], attr)
			if err != nil {
				return nil, false, err
			}
			got = append(got, a)
		}
		for _, cidr := range unselected {
			if e := v.blocks[cidr]; e != nil && !e.dirty {
				v.releaseUnselected(cidr, v.poolOf(cidr))
			}
		}
	}
	sortAllocations(got)
	return got, false, nil
}

// addQueued decides an ADD queued behind the batch's leader: one address per family, all or none,
// from the node's blocks with room, while the transaction stays within maxTxnOps. It never claims
// or borrows, and never decides on a handle that exists (read after a lost race): it skips the
// request instead, for an operation of its own.
func (v *view) addQueued(r *request) error {
	// This ADD adds its handle's compare and put, and in each family at most a block's compare and
	// put and its pool's and affinity's compares.
	if v.handle != nil || v.writeSize()+1+4*len(v.conf.Families()) > maxTxnOps {
		return errSkip
	}
	auto, err := v.selectPools(true)
	if err != nil {
		return errSkip
	}
	var use []*blockEntry
	for _, f := range v.conf.Families() {
		e := v.roomyAffine(f, auto)
		if e == nil {
			return errSkip
		}
		use = append(use, e)
	}
	v.usesReservations = true
	for _, e := range use {
		a, _ := v.assignFrom(e, r.attr)
		r.allocs = append(r.allocs, a)
	}
	sortAllocations(r.allocs)
	r.changed, r.newHandle = true, handleWith(nil, r.allocs)
	return nil
}

// writeSize bounds the compares (the larger part of the transaction) the view's write makes so far:
// the keys it uses, a listing's and the reservations' range compares, the handles it writes, and for
// each changed block its compare and put, with the overlap keys of a claim.
func (v *view) writeSize() int {
	n := len(v.uses) + 2 + len(v.handles)
	for _, c := range v.dirtyCIDRs() {
		n += 2
		if e := v.blocks[c]; e != nil && e.created {
			keys, _ := v.overlapKeys(c)
			n += len(keys)
		}
	}
	return n
}

// roomyAffine returns the first block of the node's affinities in family f of the pools, in ADD's
// order, that the node owns and has a free address; nil when there is none.
func (v *view) roomyAffine(f netaddr.Family, pools [2][]calico.IPPool) *blockEntry {
	var only [2][]calico.IPPool
	only[f] = pools[f]
	for _, cidr := range v.affineCIDRs(only) {
		if e := v.blocks[cidr]; e != nil && v.ownedByNode(e.b) && v.affinity[cidr].state == calico.AffinityConfirmed &&
			!v.reserved.CoversWhole(cidr) && e.b.Free(v.excluded) > 0 {
			return e
		}
	}
	return nil
}

// handleWith returns a copy of h (nil: a new handle) that also counts the allocations.
func handleWith(h *calico.Handle, allocs []allocation) *calico.Handle {
	out := calico.NewHandle()
	if h != nil {
		for k, n := range h.Block {
			out.Block[k] = n
		}
	}
	for _, a := range allocs {
		out.Add(a.Block, 1)
	}
	return out
}

// selectPools returns the pools of each family: the configured ones (by name or CIDR; a CIDR no
// IPPool has is used as a pool of the default block size), else, for automatic assignment, the pools
// Calico would give a pod on this node (calico.WorkloadPools: enabled, automatic, allowing Workload,
// selecting the node), and for a specific address every enabled pool that allows workloads.
func (v *view) selectPools(automatic bool) ([2][]calico.IPPool, error) {
	var out [2][]calico.IPPool
	for f := range out {
		fam := netaddr.Family(f)
		refs := v.conf.Pools[f]
		if refs == nil {
			if automatic {
				if v.workloadErr != nil {
					return out, withCode(ErrDatastore, "%w", v.workloadErr)
				}
				out[f] = v.workload[f]
				continue
			}
			for _, p := range v.pools {
				if netaddr.FamilyOf(p.CIDR.Addr()) == fam && !p.Disabled && p.AllowsWorkloads() {
					out[f] = append(out[f], p)
				}
			}
			continue
		}
		for i, ref := range refs {
			field := fmt.Sprintf("ipam.%s_pools[%d]", fam, i)
			var found *calico.IPPool
			for j := range v.pools {
				p := &v.pools[j]
				if (ref.Name != "" && p.Name == ref.Name) || (ref.CIDR.IsValid() && p.CIDR == ref.CIDR) {
					found = p
					break
				}
			}
			switch {
			case found == nil && ref.Name != "":
				return out, configError(field, "no IP pool named %q in etcd", ref.Name)
			case found == nil:
				size := calico.DefaultBlockSizeV4
				if fam == netaddr.V6 {
					size = calico.DefaultBlockSizeV6
				}
				size = max(size, ref.CIDR.Bits())
				out[f] = append(out[f], calico.IPPool{CIDR: ref.CIDR, BlockSize: size})
			case found.Disabled:
				return out, configError(field, "IP pool %q (%s) is disabled", found.Name, found.CIDR)
			case netaddr.FamilyOf(found.CIDR.Addr()) != fam:
				return out, configError(field, "IP pool %q is %s, not %s", found.Name, netaddr.FamilyOf(found.CIDR.Addr()), fam)
			case !found.AllowsWorkloads():
				return out, configError(field, "IP pool %q (%s) does not allow Workload (allowedUses %v)", found.Name, found.CIDR, found.AllowedUses)
			default:
				out[f] = append(out[f], *found)
			}
		}
	}
	return out, nil
}

// inPools reports whether the prefix lies inside one of the pools.
func inPools(p netip.Prefix, pools []calico.IPPool) bool {
	return slices.ContainsFunc(pools, func(pool calico.IPPool) bool { return pool.Contains(p) })
}

// affineCIDRs returns the CIDRs of the node's affinities inside the given pools, in the order ADD
// tries them (calico.SortAffinities).
func (v *view) affineCIDRs(pools [2][]calico.IPPool) []netip.Prefix {
	var out []netip.Prefix
	for cidr := range v.affinity {
		if inPools(cidr, pools[netaddr.FamilyOf(cidr.Addr())]) {
			out = append(out, cidr)
		}
	}
	calico.SortAffinities(out, func(c netip.Prefix) string { return v.affinity[c].state })
	return out
}

// unselected returns the node's affinities, in the families ADD assigns, to blocks of enabled pools
// that are not among the pools ADD uses and no longer select the node (candidates for
// releaseUnselected; none without the node's labels).
func (v *view) unselected(using [2][]calico.IPPool) []netip.Prefix {
	if v.node == nil {
		return nil
	}
	var out []netip.Prefix
	for cidr := range v.affinity {
		f := netaddr.FamilyOf(cidr.Addr())
		if !v.conf.Assign[f] || inPools(cidr, using[f]) {
			continue
		}
		if p := v.poolOf(cidr); p != nil && !p.Disabled && !v.selects[p.Name] {
			out = append(out, cidr)
		}
	}
	return out
}

// releaseUnselected marks for deletion, with its affinity, the block cidr of pool p if it is an empty
// block of the node and p no longer selects the node, as Calico's allocator does on every assignment
// and after a release.
func (v *view) releaseUnselected(cidr netip.Prefix, p *calico.IPPool) {
	e := v.blocks[cidr]
	if e == nil || e.release || !calico.ReleaseWhenUnselected(*p, v.node, e.b, v.conf.Node) {
		return
	}
	v.did("releasing an empty block whose pool no longer selects this node", "block", cidr, "pool", p.Name)
	e.release, e.dirty = true, true
	v.affinityWrites[cidr] = calico.AffinityStale
	v.use(cidr)
}

// poolOf returns the IPPool holding the prefix, nil when none does.
func (v *view) poolOf(p netip.Prefix) *calico.IPPool {
	for i := range v.pools {
		if inPools(p, v.pools[i:i+1]) {
			return &v.pools[i]
		}
	}
	return nil
}

// excluded reports whether automatic assignment must pass over an address: excluded by the
// configuration or reserved by an IPReservation.
func (v *view) excluded(a netip.Addr) bool {
	return calico.Reservations(v.conf.Exclude).Contains(a) || v.reserved.Contains(a)
}

// ownedByNode reports whether the node owns the block (felix's rule: its affinity field).
func (v *view) ownedByNode(b *calico.Block) bool {
	o := calico.OwnerOf(b, false)
	return o.Kind == calico.OwnerHost && o.Node == v.conf.Node
}

// assignAuto assigns one address of family f as Calico's autoAssign does (ipam.go): from the blocks
// of the node's affinities (finishing a claim Calico left pending: the missing block is created, a
// pending affinity confirmed, a stale one deleted); else from a newly claimed block, unless the node
// holds its block limit (then it fails, without borrowing) or automatic block allocation is off;
// else, unless strict affinity is on, borrowed from another block of the pools.
func (v *view) assignAuto(f netaddr.Family, pools []calico.IPPool, attr calico.AllocationAttribute) (allocation, error) {
	if len(pools) == 0 {
		why := ""
		if v.node == nil && calico.NeedsNode(v.pools) {
			why = fmt.Sprintf(" (pools with a nodeSelector need the Calico Node resource %s, which does not exist)", calico.NodeKey(v.conf.Node))
		}
		return allocation{}, configError(fmt.Sprintf("ipam.%s_pools", f), "not set and etcd holds no enabled %s IP pool for workloads on node %s%s", f, v.conf.Node, why)
	}
	var only [2][]calico.IPPool
	only[f] = pools
	affine := v.affineCIDRs(only)
	for _, cidr := range affine {
		if a, ok, err := v.assignAffine(cidr, attr); err != nil || ok {
			return a, err
		}
	}

	// Claim a new block.
	limit := v.cfg.BlockLimit(v.conf.MaxBlocks)
	switch {
	case len(affine) >= limit:
		return allocation{}, refuseClaim(refusedBlockLimit, "node %s holds %d %s blocks, the maximum per host, and they are full: at that limit Calico neither claims nor borrows",
			v.conf.Node, len(affine), f)
	case !v.cfg.AutoAllocateBlocks:
		return allocation{}, refuseClaim(refusedAutoAllocateOff, "%s: the node's blocks are full and auto_allocate_blocks is off in the Calico IPAM config", f)
	}
	a, ok, err := v.claim(f, pools, attr)
	if err != nil || ok {
		return a, err
	}
	why := "no free block left in the pools"

	// Borrow.
	if v.cfg.StrictAffinity {
		return allocation{}, refuseClaim(refusedStrictAffinity, "%s pool exhausted for node %s: its blocks are full, %s, and strict affinity forbids borrowing from other nodes' blocks",
			f, v.conf.Node, why)
	}
	if err := v.requireFamily(f); err != nil {
		return allocation{}, err
	}
	// Calico's order: pool by pool, each walked from the node's start index (calico.BorrowOrder).
	var family []netip.Prefix
	for cidr, e := range v.blocks {
		if e != nil && netaddr.FamilyOf(cidr.Addr()) == f {
			family = append(family, cidr)
		}
	}
	var e *blockEntry
	for _, pool := range pools {
		for _, cidr := range calico.BorrowOrder(pool, v.conf.Node, family) {
			if c := v.blocks[cidr]; !v.reserved.CoversWhole(cidr) && c.b.Free(v.excluded) > 0 {
				e = c
				break
			}
		}
		if e != nil {
			break
		}
	}
	if e == nil {
		return allocation{}, refuseClaim(refusedPoolExhausted, "%s pool exhausted: no free address in any block of %s (%s)", f, poolNames(pools), why)
	}
	a, _ = v.assignFrom(e, attr)
	v.did("borrowing an address from another node's block", "block", e.b.CIDR, "addr", a.Addr, "why", why)
	return a, nil
}

// assignAffine assigns from the block of one of the node's affinities, doing first what the
// affinity's state asks for (calico.StepFor); ok is false when the block cannot serve.
func (v *view) assignAffine(cidr netip.Prefix, attr calico.AllocationAttribute) (allocation, bool, error) {
	if v.bad[cidr] != nil || v.reserved.CoversWhole(cidr) {
		return allocation{}, false, nil
	}
	e := v.blocks[cidr]
	var b *calico.Block
	if e != nil {
		b = e.b
	}
	switch step := calico.StepFor(v.conf.Node, v.affinity[cidr].state, b); step {
	case calico.AffinityStale:
		v.did("deleting a stale affinity: its block belongs to another owner", "block", cidr)
		v.affinityWrites[cidr] = step
		return allocation{}, false, nil
	case calico.AffinityCreate:
		// The new block must not overlap a block of another size.
		l, err := v.listing(netaddr.FamilyOf(cidr.Addr()))
		if err != nil || slices.ContainsFunc(l.cidrs, cidr.Overlaps) {
			return allocation{}, false, err
		}
		e = newBlockEntry(cidr, v.conf.Node)
		a, ok := v.assignFrom(e, attr)
		if ok {
			v.blocks[cidr] = e
			v.did("creating the block of an affinity left without it (an interrupted claim)", "block", cidr, "state", v.affinity[cidr].state)
		}
		return a, ok, nil
	case calico.AffinityConfirm:
		a, ok := v.assignFrom(e, attr)
		if ok {
			v.affinityWrites[cidr] = step
		}
		return a, ok, nil
	}
	a, ok := v.assignFrom(e, attr)
	return a, ok, nil
}

// newBlockEntry is a block node claims.
func newBlockEntry(cidr netip.Prefix, node string) *blockEntry {
	return &blockEntry{b: calico.NewBlock(cidr, "host:"+node, uint64(time.Now().UnixNano())), created: true, own: true}
}

// assignFrom takes the first usable free address of a loaded block.
func (v *view) assignFrom(e *blockEntry, attr calico.AllocationAttribute) (allocation, bool) {
	if e.b.Free(v.excluded) == 0 {
		return allocation{}, false
	}
	ords := e.edit().AutoAssign(1, attr, v.excluded)
	if len(ords) == 0 {
		return allocation{}, false
	}
	e.dirty = true
	v.use(e.b.CIDR)
	addr, _ := calico.OrdinalAddr(e.b.CIDR, ords[0])
	return allocation{Block: e.b.CIDR, Addr: addr}, true
}

// claim picks the first free block-sized subnet of the pools, walking each pool from the node's start
// index and avoiding every existing block and excluded range, and assigns from it. The block is
// written by commit together with its confirmed affinity, conditional on no block of the family
// having been created meanwhile.
func (v *view) claim(f netaddr.Family, pools []calico.IPPool, attr calico.AllocationAttribute) (allocation, bool, error) {
	l, err := v.listing(f)
	if err != nil {
		return allocation{}, false, err
	}
	reserved := append(slices.Clone(v.conf.Exclude), v.reserved...)
	for _, pool := range pools {
		used := slices.Clone(l.cidrs)
		// A subnet only partly reserved might hold no usable address; give up on it and walk on.
		for range 64 {
			cidr, ok := calico.NextFreeBlock(pool, v.conf.Node, used, reserved)
			if !ok {
				break
			}
			e := newBlockEntry(cidr, v.conf.Node)
			if a, ok := v.assignFrom(e, attr); ok {
				v.blocks[cidr] = e
				v.did("claiming block", "block", cidr, "pool", pool.CIDR)
				return a, true, nil
			}
			used = append(used, cidr)
		}
	}
	return allocation{}, false, nil
}

// assignSpecific assigns the requested address ip: in the block that holds it, claiming that block
// (the pool's block-sized subnet around ip) when there is none.
func (v *view) assignSpecific(pools []calico.IPPool, ip netip.Addr, attr calico.AllocationAttribute) (allocation, error) {
	f := netaddr.FamilyOf(ip)
	var pool *calico.IPPool
	for i := range pools {
		if pools[i].CIDR.Contains(ip) {
			pool = &pools[i]
			break
		}
	}
	if pool == nil {
		return allocation{}, withCode(ErrAddressUnavailable, "requested address %s is outside the %s pools (%s)", ip, f, poolNames(pools))
	}
	// IPReservations bind automatic assignment only: Calico's AssignIP does not check them.
	if calico.Reservations(v.conf.Exclude).Contains(ip) {
		return allocation{}, withCode(ErrAddressUnavailable, "requested address %s is excluded (ipam.exclude)", ip)
	}
	e, err := v.blockHolding(ip)
	if err != nil {
		return allocation{}, err
	}
	if e == nil {
		cidr := netip.PrefixFrom(ip, pool.BlockSize).Masked()
		l, err := v.listing(f)
		if err != nil {
			return allocation{}, err
		}
		for _, other := range l.cidrs {
			if other.Overlaps(cidr) {
				return allocation{}, withCode(ErrAddressUnavailable, "requested address %s: its block %s would overlap the existing block %s", ip, cidr, other)
			}
		}
		if !v.cfg.AutoAllocateBlocks {
			return allocation{}, withCode(ErrAddressUnavailable, "requested address %s: block %s does not exist and auto_allocate_blocks is off", ip, cidr)
		}
		e = newBlockEntry(cidr, v.conf.Node)
		v.blocks[cidr] = e
		v.did("claiming block for a requested address", "block", cidr, "addr", ip)
	}
	if !v.ownedByNode(e.b) && v.cfg.StrictAffinity {
		return allocation{}, withCode(ErrAddressUnavailable, "requested address %s is in block %s, not affine to node %s, and strict affinity is on",
			ip, e.b.CIDR, v.conf.Node)
	}
	ord, _ := calico.Ordinal(e.b.CIDR, ip)
	if a := e.b.AttributeOf(ord); a != nil {
		if a.Handle() == attr.Handle() {
			return allocation{}, withCode(ErrAddressUnavailable, "requested address %s is held by interface %s of this container", ip, ifnameOf(a))
		}
		return allocation{}, withCode(ErrAddressUnavailable, "requested address %s is held by handle %q", ip, a.Handle())
	}
	if err := e.edit().Assign(ord, attr); err != nil {
		return allocation{}, withCode(ErrDatastore, "requested address %s: %w", ip, err)
	}
	e.dirty = true
	v.use(e.b.CIDR)
	return allocation{Block: e.b.CIDR, Addr: ip}, nil
}

// blockHolding returns the block that contains ip (loading it), or nil when there is none.
func (v *view) blockHolding(ip netip.Addr) (*blockEntry, error) {
	for cidr, e := range v.blocks {
		if e != nil && cidr.Contains(ip) {
			return e, nil
		}
	}
	l, err := v.listing(netaddr.FamilyOf(ip))
	if err != nil {
		return nil, err
	}
	var hits []netip.Prefix
	for _, cidr := range l.cidrs {
		if cidr.Contains(ip) {
			hits = append(hits, cidr)
		}
	}
	if err := v.require(hits...); err != nil {
		return nil, err
	}
	// Overlapping blocks (after a pool's block size changed): the most specific one holds ip.
	slices.SortFunc(hits, func(a, b netip.Prefix) int { return b.Bits() - a.Bits() })
	for _, cidr := range hits {
		if err := v.bad[cidr]; err != nil {
			return nil, err
		}
		if e := v.blocks[cidr]; e != nil {
			return e, nil
		}
	}
	return nil, nil
}

func poolNames(pools []calico.IPPool) string {
	var s []string
	for _, p := range pools {
		if p.Name != "" {
			s = append(s, p.Name+" "+p.CIDR.String())
		} else {
			s = append(s, p.CIDR.String())
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
