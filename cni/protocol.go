package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// The plugin and the node daemon speak on a unix socket, one exchange per connection: the plugin
// writes its request and shuts its side down, the daemon writes its reply and closes. No HTTP: net/http
// alone adds 0.4 ms to every start of the plugin, which the runtime pays on every ADD and DEL; both
// sides bound what they read by MaxMessage and by a deadline. Today's plugin (package shim) sends the
// CNI call as the runtime made it, in a frame (ServeFrame answers it). The JSON Request and Reply
// below are the protocol of the plugins before it, which the daemon still answers so that a node
// can upgrade the daemon and the plugin in either order; Call is their client.
const (
	// DefaultSocket is where the daemon listens and the shim connects unless ipam.socket says otherwise.
	DefaultSocket = shim.DefaultSocket
	// MaxMessage bounds a request or reply, in either protocol.
	MaxMessage = shim.MaxFrame
)

// Request is one CNI operation the shim hands the daemon: the per-network allocation settings of the
// configuration and the per-call environment, already parsed and validated by LoadConfig. The daemon
// validates what it relies on again (the socket is the trust boundary, not the shim).
type Request struct {
	Verb        string `json:"verb"` // ADD, DEL, CHECK, GC or STATUS
	ContainerID string `json:"containerID,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	Network     string `json:"network"`
	// Node is the node name the network configuration gives (calico-ipam's nodename), "" when it
	// gives none: the daemon refuses a request meant for another node.
	Node string `json:"node,omitempty"`
	// Timeout is how long the shim waits for the reply; the daemon gives up on the operation then.
	Timeout time.Duration `json:"timeout,omitempty"`

	// Assign says which families ADD allocates automatically.
	Assign [2]bool `json:"assign"`
	// Pools lists the configured pools of each family; nil means every pool Calico would use.
	Pools [2][]PoolRef `json:"pools,omitempty"`
	// Exclude are ranges never handed out.
	Exclude []netip.Prefix `json:"exclude,omitempty"`
	// MaxBlocks caps the node's blocks per family; 0 takes Calico's IPAM config.
	MaxBlocks    int          `json:"maxBlocks,omitempty"`
	RequestedIPs []netip.Addr `json:"requestedIPs,omitempty"`
	// Namespace and Pod come from CNI_ARGS.
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`

	// HaveAttachments tells GC's absent list (release nothing) from an empty one.
	HaveAttachments  bool                 `json:"haveAttachments,omitempty"`
	ValidAttachments []types.GCAttachment `json:"validAttachments,omitempty"`
	// PrevIPs are the addresses of CHECK's prevResult.
	PrevIPs []netip.Addr `json:"prevIPs,omitempty"`
}

// PoolRef names a pool in the configuration: a CIDR or the name of a Calico IPPool.
type PoolRef struct {
	CIDR netip.Prefix `json:"cidr,omitzero"`  // set when the reference is a CIDR
	Name string       `json:"name,omitempty"` // set when it is a pool name
}

// Allocation is one address held in a block.
type Allocation struct {
	Block netip.Prefix `json:"block"`
	Addr  netip.Addr   `json:"addr"`
}

// Reply is the daemon's answer. Code 0 is success; otherwise Code and Msg are the CNI error.
type Reply struct {
	Code uint   `json:"code,omitempty"`
	Msg  string `json:"msg,omitempty"`
	// Node is the daemon's node name.
	Node string `json:"node"`
	// Allocations are ADD's addresses, IPv4 first.
	Allocations []Allocation `json:"allocations,omitempty"`
	// Released counts GC's releases.
	Released int `json:"released,omitempty"`
	// RoundTrips counts the etcd round trips of the operation (0: served by another request's write);
	// Attempts its optimistic attempts; Batched the other requests (ADDs or DELs) its writes served.
	RoundTrips int64 `json:"roundTrips"`
	Attempts   int   `json:"attempts"`
	Batched    int   `json:"batched,omitempty"`
}

// Err returns the reply's error, nil on success.
func (r *Reply) Err() error {
	if r.Code == 0 {
		return nil
	}
	return &types.Error{Code: r.Code, Msg: r.Msg}
}

// ErrUnreachable marks a daemon that could not be asked or did not answer: nothing is known about the
// operation's outcome (the runtime's retry is idempotent).
var ErrUnreachable = errors.New("block-ipam daemon unreachable")

// Call sends req to the daemon listening on socket and returns its reply, within ctx's deadline. An
// error wraps ErrUnreachable when the daemon could not be reached or died before answering.
func Call(ctx context.Context, socket string, req *Request) (*Reply, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write(body); err != nil {
		return nil, fmt.Errorf("%w at %s: sending the request: %w", ErrUnreachable, socket, err)
	}
	if err := conn.(*net.UnixConn).CloseWrite(); err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, socket, err)
	}
	data, err := io.ReadAll(io.LimitReader(conn, MaxMessage+1))
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("%w at %s: waiting for the reply: %w", ErrUnreachable, socket, err)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%w at %s: the daemon closed the connection without a reply", ErrUnreachable, socket)
	}
	if len(data) > MaxMessage {
		return nil, fmt.Errorf("block-ipam daemon at %s: reply larger than %d bytes", socket, MaxMessage)
	}
	var reply Reply
	if err := json.Unmarshal(data, &reply); err != nil {
		return nil, fmt.Errorf("block-ipam daemon at %s: undecodable reply %.200q: %w", socket, data, err)
	}
	return &reply, nil
}
