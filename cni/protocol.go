package cni

import (
	"net/netip"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// The plugin and the node daemon speak on a unix socket, one exchange per connection: the plugin
// writes its request, a frame that carries its length, and waits with its side open; the daemon
// writes its reply and closes (the plugin's hang-up ends the daemon's read of it: shim.Magic). No HTTP: net/http
// alone adds 0.4 ms to every start of the plugin, which the runtime pays on every ADD and DEL; both
// sides bound what they read by MaxMessage and by a deadline. The plugin (package shim) sends the CNI
// call as the runtime made it, in a frame; the daemon decodes it (Decode), serves its Request and
// renders the Reply (Call.Render). Plugin and daemon come from one release: a frame that does not
// begin with shim.Magic is refused, either way. Request and Reply below are in-process types.
const (
	// DefaultSocket is where the daemon listens and the shim connects unless ipam.socket says otherwise.
	DefaultSocket = shim.DefaultSocket
	// MaxMessage bounds a request or a reply frame.
	MaxMessage = shim.MaxFrame
)

// Request is one CNI operation the daemon serves: the per-network allocation settings of the
// configuration and the per-call environment, parsed and validated where the call entered (Decode).
type Request struct {
	Verb        string // ADD, DEL, CHECK, GC or STATUS
	ContainerID string
	IfName      string
	Network     string
	// Node is the node name the network configuration gives (calico-ipam's nodename), "" when it
	// gives none: the daemon refuses a request meant for another node.
	Node string
	// Timeout is how long the shim waits for the reply; the daemon gives up on the operation then.
	Timeout time.Duration

	// Assign says which families ADD allocates automatically.
	Assign [2]bool
	// Pools lists the configured pools of each family; nil means every pool Calico would use.
	Pools [2][]PoolRef
	// Exclude are ranges never handed out.
	Exclude []netip.Prefix
	// MaxBlocks caps the node's blocks per family; 0 takes Calico's IPAM config.
	MaxBlocks    int
	RequestedIPs []netip.Addr
	// Namespace and Pod come from CNI_ARGS.
	Namespace string
	Pod       string

	// HaveAttachments tells GC's absent list (release nothing) from an empty one.
	HaveAttachments  bool
	ValidAttachments []types.GCAttachment
	// PrevIPs are the addresses of CHECK's prevResult.
	PrevIPs []netip.Addr
}

// PoolRef names a pool in the configuration: a CIDR or the name of a Calico IPPool.
type PoolRef struct {
	CIDR netip.Prefix // set when the reference is a CIDR
	Name string       // set when it is a pool name
}

// Allocation is one address held in a block.
type Allocation struct {
	Block netip.Prefix
	Addr  netip.Addr
}

// Reply is the daemon's answer. Code 0 is success; otherwise Code and Msg are the CNI error.
type Reply struct {
	Code uint
	Msg  string
	// Node is the daemon's node name.
	Node string
	// Allocations are ADD's addresses, IPv4 first.
	Allocations []Allocation
	// Released counts GC's releases.
	Released int
	// RoundTrips counts the etcd round trips of the operation (0: served by another request's write);
	// Attempts its optimistic attempts; Batched the other requests (ADDs or DELs) its writes served.
	RoundTrips int64
	Attempts   int
	Batched    int
}

// Err returns the reply's error, nil on success.
func (r *Reply) Err() error {
	if r.Code == 0 {
		return nil
	}
	return &types.Error{Code: r.Code, Msg: r.Msg}
}
