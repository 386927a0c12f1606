// Package release gives a dead node's IPAM addresses back: the allocations its pods hold (their
// secondary attribute "node" names it) and their handles, its host affinities, and its blocks (deleted
// when left empty, else left without owner, as Calico's ReleaseHostAffinities does), so that other
// nodes can claim the blocks again. Plan reads what would be released at one etcd revision and
// writes nothing; Commit releases it in conditional transactions, each on the mod revisions the plan
// read and on the node still looking dead, so that any concurrent change (the node coming back, another
// operator, a pod added) aborts the commit and a new plan picks it up. A commit interrupted halfway
// (etcd lost) leaves every transaction either applied or not: a new plan finds what is left, and
// nothing is released twice. `block-ipam release-node` and block-ipamd's --release-dead-nodes-after
// (Reaper) both use it.
package release

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// RecordPrefix holds one record per release, RecordPrefix+<node>/<time RFC 3339, UTC>, a JSON Record
// of what was released, on a lease of RecordTTL.
const RecordPrefix = "/vpp-calico/ipam/releases/"

// RecordTTL is how long a release record stays in etcd.
const RecordTTL = 30 * 24 * time.Hour

// maxTxnOps stays under etcd's default --max-txn-ops (128), compares and operations alike.
const maxTxnOps = 100

// pageSize is the blocks read per round trip while scanning the blocks.
const pageSize = 200

// ErrUnknownNode: nothing in etcd names the node (no affinity, block, allocation, liveness key,
// registration, Calico Node or release record).
var ErrUnknownNode = errors.New("unknown node")

// ErrAlive: the node looks alive (a liveness key or a route agent registration exists); AliveError
// names what was seen.
var ErrAlive = errors.New("node looks alive")

// Options says which node to release and how to reach etcd.
type Options struct {
	Client *clientv3.Client
	// KV runs the reads and transactions (default Client.KV): tests interpose failures here.
	KV   clientv3.KV
	Node string
	// HostsPrefix is the route agents' registration prefix (default ipamd.DefaultHostsPrefix).
	HostsPrefix string
	// Force releases a node that looks alive.
	Force bool
	// By names who releases, in the record ("release-node by user@host", "block-ipamd on <node>").
	By string
	// CallTimeout bounds each etcd call (default 5 s).
	CallTimeout time.Duration
	Logger      *slog.Logger
}

func (o *Options) defaults() error {
	if o.Client == nil && o.KV == nil {
		return errors.New("release: no etcd client")
	}
	if err := calico.CheckNodeName(o.Node); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if o.KV == nil {
		o.KV = o.Client.KV
	}
	if o.HostsPrefix == "" {
		o.HostsPrefix = ipamd.DefaultHostsPrefix
	}
	if !strings.HasSuffix(o.HostsPrefix, "/") {
		o.HostsPrefix += "/"
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// registrationPrefix is where the node's route agent registers.
func (o *Options) registrationPrefix() string { return o.HostsPrefix + o.Node + "/" }

// Sign is one key that makes the node look alive.
type Sign struct {
	Key string `json:"key"`
	// Lease is the key's lease (0: none: the key stays until deleted).
	Lease int64 `json:"lease,omitempty"`
	// TTLLeft is the lease's remaining time as etcd reported it (-1: unknown or no lease).
	TTLLeft time.Duration `json:"-"`
	// TTLSeconds is TTLLeft in whole seconds (-1: unknown or no lease), for JSON.
	TTLSeconds int64 `json:"ttl_left_seconds"`
}

func (s Sign) String() string {
	switch {
	case s.Lease == 0:
		return s.Key + " (no lease)"
	case s.TTLLeft < 0:
		return fmt.Sprintf("%s on lease %x", s.Key, s.Lease)
	}
	return fmt.Sprintf("%s on lease %x, TTL %s left", s.Key, s.Lease, s.TTLLeft)
}

// AliveError is the refusal to release a node that looks alive.
type AliveError struct {
	Node  string
	Signs []Sign
}

func (e *AliveError) Error() string {
	var s []string
	for _, g := range e.Signs {
		s = append(s, g.String())
	}
	return fmt.Sprintf("node %s looks alive: %s (release it only once it is gone, or with --force)", e.Node, strings.Join(s, "; "))
}

func (e *AliveError) Unwrap() error { return ErrAlive }

// Allocation is one allocated address.
type Allocation struct {
	Addr      netip.Addr `json:"addr"`
	Ordinal   int        `json:"-"`
	Handle    string     `json:"handle,omitempty"`
	Node      string     `json:"node,omitempty"`
	Namespace string     `json:"namespace,omitempty"`
	Pod       string     `json:"pod,omitempty"`
}

// BlockAction is what happens to a block once the node's allocations are released from it.
type BlockAction string

// Block actions.
const (
	// BlockDelete: the block is left empty and is deleted (it can be claimed again at once).
	BlockDelete BlockAction = "delete"
	// BlockUnown: the node's block keeps allocations of other nodes (or without node): its affinity
	// becomes null, as Calico's ReleaseHostAffinities does; Calico deletes it once it is empty.
	BlockUnown BlockAction = "unown"
	// BlockUpdate: a block of another node (or of none) loses the node's borrowed allocations.
	BlockUpdate BlockAction = "update"
	// BlockNone: nothing in the block changes (only the node's affinity key for it goes).
	BlockNone BlockAction = "none"
)

// BlockPlan is what the release does to one block.
type BlockPlan struct {
	CIDR netip.Prefix `json:"cidr"`
	Key  string       `json:"key"`
	// Owner is the block's affinity as read ("host:<node>", "virtual:<name>", "" for null).
	Owner  string      `json:"owner"`
	Action BlockAction `json:"action"`
	// Release are the node's allocations released; Kept the others, which stay.
	Release []Allocation `json:"release,omitempty"`
	Kept    []Allocation `json:"kept,omitempty"`
	// AffinityKey is the node's affinity key for this block, deleted with it ("" if none).
	AffinityKey string `json:"affinity_key,omitempty"`

	modRev, affinityModRev int64
	block                  *calico.Block
}

// Orphan is an affinity key of the node whose block does not exist: deleted.
type Orphan struct {
	Key   string       `json:"key"`
	CIDR  netip.Prefix `json:"cidr"`
	State string       `json:"state,omitempty"`

	modRev int64
}

// Skipped is a value the release leaves alone because it cannot be read or is not well formed: it
// may hold the node's addresses, which an operator must then release by hand.
type Skipped struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

// HandleChange is what the release does to one handle.
type HandleChange struct {
	ID string `json:"id"`
	// Released is the number of the handle's addresses released; Delete: nothing is left in it.
	Released int  `json:"released"`
	Delete   bool `json:"delete"`
	// Missing: the handle key does not exist (an orphan allocation): nothing to change.
	Missing bool `json:"missing,omitempty"`
	// Malformed: the handle's value does not decode: left as it is.
	Malformed bool `json:"malformed,omitempty"`
}

// Plan is what releasing the node would do, read at one revision. A plan with nothing in it is
// Empty.
type Plan struct {
	Node     string `json:"node"`
	Revision int64  `json:"revision"`
	// Alive are the keys that make the node look alive (empty: it looks dead); a plan with signs
	// commits only with Force.
	Alive      []Sign         `json:"alive,omitempty"`
	Blocks     []BlockPlan    `json:"blocks"`
	Orphans    []Orphan       `json:"orphan_affinities,omitempty"`
	Handles    []HandleChange `json:"handles"`
	Skipped    []Skipped      `json:"skipped,omitempty"`
	Calico     bool           `json:"calico_node"`
	LastRecord string         `json:"last_record,omitempty"`

	handles map[string]*handleState
}

type handleState struct {
	h         *calico.Handle // nil: missing or malformed
	modRev    int64
	malformed bool
}

// Empty reports whether the plan releases nothing.
func (p *Plan) Empty() bool { return len(p.Blocks) == 0 && len(p.Orphans) == 0 }

// Addresses is the number of allocations the plan releases.
func (p *Plan) Addresses() int {
	n := 0
	for _, b := range p.Blocks {
		n += len(b.Release)
	}
	return n
}

// NewPlan reads, at one revision, everything of the node's that a release would change: the signs
// of life, its affinity keys, every block (those it owns, and others holding its borrowed
// allocations) and the handles of its allocations. It writes nothing. A node nothing names fails
// with ErrUnknownNode.
func NewPlan(ctx context.Context, o Options) (*Plan, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	p := &Plan{Node: o.Node, handles: map[string]*handleState{}}
	node := o.Node
	get := func(key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
		defer cancel()
		if p.Revision != 0 {
			opts = append(opts, clientv3.WithRev(p.Revision))
		}
		resp, err := o.KV.Get(cctx, key, opts...)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", key, err)
		}
		if p.Revision == 0 {
			p.Revision = resp.Header.Revision
		}
		return resp, nil
	}
	// Signs of life first: their revision is the plan's.
	alive, err := get(ipamd.AliveKey(node))
	if err != nil {
		return nil, err
	}
	reg, err := get(o.registrationPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	for _, kv := range append(alive.Kvs, reg.Kvs...) {
		s := Sign{Key: string(kv.Key), Lease: kv.Lease, TTLLeft: -1}
		if kv.Lease != 0 && o.Client != nil {
			cctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
			if ttl, err := o.Client.TimeToLive(cctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL >= 0 {
				s.TTLLeft = time.Duration(ttl.TTL) * time.Second
			}
			cancel()
		}
		s.TTLSeconds = -1
		if s.TTLLeft >= 0 {
			s.TTLSeconds = int64(s.TTLLeft / time.Second)
		}
		p.Alive = append(p.Alive, s)
	}

	// The node's affinity keys, by block key.
	aff, err := get(calico.HostAffinityNodePrefix(node), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	type affinity struct {
		key    string
		cidr   netip.Prefix
		state  string
		modRev int64
	}
	affinities := map[string]affinity{}
	for _, kv := range aff.Kvs {
		k, err := calico.ParseKey(string(kv.Key))
		if err != nil || k.Kind != calico.KindHostAffinity {
			p.skip(o, string(kv.Key), fmt.Sprintf("not an affinity key: %v", err))
			continue
		}
		a := affinity{key: string(kv.Key), cidr: k.CIDR, modRev: kv.ModRevision}
		if v, err := calico.DecodeAffinity(kv.Value); err == nil {
			a.state = v.State
		}
		// An affinity value that does not decode is deleted all the same: the key alone is the claim.
		affinities[calico.BlockKey(k.CIDR)] = a
	}

	// Every block: the node's own and those holding its borrowed allocations.
	seen := map[string]bool{}
	for _, fam := range netaddr.Families {
		prefix := calico.BlockPrefix + fam.String() + "/block/"
		from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
		for {
			resp, err := get(from, clientv3.WithRange(end), clientv3.WithLimit(pageSize))
			if err != nil {
				return nil, err
			}
			for _, kv := range resp.Kvs {
				key := string(kv.Key)
				seen[key] = true
				a, hasAff := affinities[key]
				bp, why := planBlock(node, key, kv.Value, kv.ModRevision)
				switch {
				case why != "":
					if hasAff || mentions(kv.Value, node) {
						p.skip(o, key, why)
						delete(affinities, key) // kept: the block may be the node's
					}
					continue
				case bp == nil && !hasAff:
					continue
				case bp == nil:
					// The node's affinity key names a block that is not its own (a lost race or a
					// duplicate): only the key goes.
					bp = &BlockPlan{CIDR: a.cidr, Key: key, Action: BlockNone, modRev: kv.ModRevision, Owner: ownerText(kv.Value)}
				}
				if hasAff {
					bp.AffinityKey, bp.affinityModRev = a.key, a.modRev
				}
				p.Blocks = append(p.Blocks, *bp)
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}
	for key, a := range affinities {
		if !seen[key] {
			p.Orphans = append(p.Orphans, Orphan{Key: a.key, CIDR: a.cidr, State: a.state, modRev: a.modRev})
		}
	}
	slices.SortFunc(p.Orphans, func(a, b Orphan) int { return strings.Compare(a.Key, b.Key) })

	// The handles of the allocations released.
	count := map[string]int{}
	for _, b := range p.Blocks {
		for _, a := range b.Release {
			if a.Handle != "" {
				count[a.Handle]++
			}
		}
	}
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range count {
			if !yield(id) {
				return
			}
		}
	})
	// Read in transactions of maxTxnOps gets at the plan's revision: one round trip per 100 handles.
	values := map[string]*mvccpb.KeyValue{}
	for start := 0; start < len(ids); start += maxTxnOps {
		var ops []clientv3.Op
		for _, id := range ids[start:min(start+maxTxnOps, len(ids))] {
			ops = append(ops, clientv3.OpGet(calico.HandleKey(id), clientv3.WithRev(p.Revision)))
		}
		cctx, cancel := context.WithTimeout(ctx, o.CallTimeout)
		resp, err := o.KV.Txn(cctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read the handles: %w", err)
		}
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().Kvs {
				values[string(kv.Key)] = kv
			}
		}
	}
	for _, id := range ids {
		kv := values[calico.HandleKey(id)]
		st := &handleState{}
		hc := HandleChange{ID: id, Released: count[id]}
		if kv == nil {
			hc.Missing = true
		} else if h, err := calico.DecodeHandle(kv.Value); err != nil {
			// Left as it is (the allocations are released all the same): what it holds elsewhere
			// cannot be known.
			p.skip(o, calico.HandleKey(id), fmt.Sprintf("handle value does not decode (%v): left as it is", err))
			st.modRev, st.malformed = kv.ModRevision, true
			hc.Malformed = true
		} else {
			st.h, st.modRev = h, kv.ModRevision
			rest := h.Count() - count[id]
			hc.Delete = rest <= 0
		}
		p.handles[id] = st
		p.Handles = append(p.Handles, hc)
	}

	if p.Empty() && len(p.Alive) == 0 && len(p.Skipped) == 0 {
		n, err := get(calico.NodePrefix+node, clientv3.WithCountOnly())
		if err != nil {
			return nil, err
		}
		p.Calico = n.Count > 0
		rec, err := get(RecordPrefix+node+"/", append(clientv3.WithLastKey(), clientv3.WithKeysOnly())...)
		if err != nil {
			return nil, err
		}
		if len(rec.Kvs) > 0 {
			p.LastRecord = string(rec.Kvs[0].Key)
		}
		if !p.Calico && p.LastRecord == "" {
			return nil, fmt.Errorf("node %q: %w: no host affinity, block, allocation, liveness key (%s), route agent registration (%s), Calico Node or release record (%s) names it",
				node, ErrUnknownNode, ipamd.AliveKey(node), o.registrationPrefix(), RecordPrefix+node+"/")
		}
	}
	return p, nil
}

// skip records a value left alone, and logs it.
func (p *Plan) skip(o Options, key, reason string) {
	o.Logger.Warn("release: leaving a value alone", "node", p.Node, "key", key, "reason", reason)
	p.Skipped = append(p.Skipped, Skipped{Key: key, Reason: reason})
}

// mentions reports whether a value that cannot be read names the node anywhere: it may then hold
// the node's block or addresses.
func mentions(value []byte, node string) bool {
	return bytes.Contains(value, []byte(`"host:`+node+`"`)) || bytes.Contains(value, []byte(`"`+node+`"`))
}

// ownerText is a block's affinity as text, "" when null or unreadable.
func ownerText(value []byte) string {
	b, err := calico.DecodeBlock(value)
	if err != nil || b.Affinity == nil {
		return ""
	}
	return *b.Affinity
}

// planBlock decides one block: nil when the release does not concern it, else its plan; why is set
// when the block cannot be read or is not well formed (its plan is then nil).
func planBlock(node, key string, value []byte, modRev int64) (bp *BlockPlan, why string) {
	// Most blocks are other nodes' and hold none of this node's addresses: the routing decoder tells
	// so at a fraction of a full decode's cost.
	r, err := calico.DecodeRouting(value)
	if err != nil {
		return nil, err.Error()
	}
	if o := r.Owner(false); !(o.Kind == calico.OwnerHost && o.Node == node) && !slices.ContainsFunc(r.Borrowed(calico.Owner{}), func(b calico.Borrowed) bool { return b.Node == node }) {
		return nil, ""
	}
	b, err := calico.DecodeBlock(value)
	if err != nil {
		return nil, err.Error()
	}
	if b.Deleted {
		return nil, ""
	}
	if k, err := calico.ParseKey(key); err != nil || k.Kind != calico.KindBlock || k.CIDR != netaddr.Canonical(b.CIDR) {
		return nil, fmt.Sprintf("key does not match the block's cidr %s", b.CIDR)
	}
	owner := calico.OwnerOf(b, false)
	own := owner.Kind == calico.OwnerHost && owner.Node == node
	var release, kept []Allocation
	for ord := range b.Allocations {
		a := b.AttributeOf(ord)
		if b.Allocations[ord] == nil {
			continue
		}
		addr, _ := calico.OrdinalAddr(b.CIDR, ord)
		al := Allocation{Addr: addr, Ordinal: ord}
		if a != nil {
			al.Handle = calico.SanitizeHandle(a.Handle())
			al.Node, al.Namespace, al.Pod = a.Secondary[calico.AttrNode], a.Secondary[calico.AttrNamespace], a.Secondary[calico.AttrPod]
		}
		if al.Node == node {
			release = append(release, al)
		} else {
			kept = append(kept, al)
		}
	}
	if !own && len(release) == 0 {
		return nil, ""
	}
	// Checked only for the blocks the release changes: a broken block elsewhere is not ours to judge.
	if err := b.Validate(); err != nil {
		return nil, err.Error()
	}
	bp = &BlockPlan{CIDR: b.CIDR, Key: key, Release: release, Kept: kept, modRev: modRev, block: b}
	if b.Affinity != nil {
		bp.Owner = *b.Affinity
	}
	switch {
	case len(kept) == 0 && (own || b.Affinity == nil):
		bp.Action = BlockDelete
	case own:
		bp.Action = BlockUnown
	default:
		bp.Action = BlockUpdate
	}
	return bp, ""
}
