package calico

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// Affinity states Calico writes in affinity values.
const (
	AffinityConfirmed       = "confirmed"
	AffinityPending         = "pending"
	AffinityPendingDeletion = "pendingDeletion"
)

// AffinityValue is the value of a host or virtual affinity key. felix takes ownership from the
// block's own affinity field, not from these; IPAM writers keep them in step with blocks, which is
// what lets a reader take ownership from them when strict affinity is on (blockwatch.Ownership).
type AffinityValue struct {
	State   string `json:"state"`
	Deleted bool   `json:"deleted"`
}

// DecodeAffinity decodes an affinity value.
func DecodeAffinity(data []byte) (AffinityValue, error) {
	var v AffinityValue
	if err := json.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("decode affinity: %w", err)
	}
	return v, nil
}

// Handle is the value of an IPAM handle key: how many addresses the handle holds in each block (keyed
// by the block CIDR with "/"). The handle ID lives only in the key.
type Handle struct {
	Block   map[string]int `json:"block"`
	Deleted bool           `json:"deleted"`
}

// DecodeHandle decodes a handle value.
func DecodeHandle(data []byte) (*Handle, error) {
	var h Handle
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("decode handle: %w", err)
	}
	if h.Block == nil {
		h.Block = map[string]int{}
	}
	return &h, nil
}

// Count returns the number of addresses the handle holds in all blocks.
func (h *Handle) Count() int {
	n := 0
	for _, c := range h.Block {
		n += c
	}
	return n
}

// DefaultMaxBlocksPerHost is the block cap Calico applies when maxBlocksPerHost is 0 or unset.
const DefaultMaxBlocksPerHost = 20

// IPAMConfig is the cluster IPAM configuration (key IPAMConfigKey), with Calico's defaults applied: a
// missing key or field means strict affinity off, automatic block allocation on, and a cap of 20 blocks.
type IPAMConfig struct {
	StrictAffinity     bool
	AutoAllocateBlocks bool
	// MaxBlocksPerHost as stored; 0 means the default cap (see BlockCap).
	MaxBlocksPerHost int
}

type ipamConfigJSON struct {
	StrictAffinity     bool  `json:"strict_affinity,omitempty"`
	AutoAllocateBlocks *bool `json:"auto_allocate_blocks,omitempty"`
	MaxBlocksPerHost   int   `json:"maxBlocksPerHost,omitempty"`
}

// DefaultIPAMConfig is the configuration in force when the key does not exist.
func DefaultIPAMConfig() IPAMConfig { return IPAMConfig{AutoAllocateBlocks: true} }

// DecodeIPAMConfig decodes the IPAM config value, applying Calico's defaults to missing fields.
func DecodeIPAMConfig(data []byte) (IPAMConfig, error) {
	var j ipamConfigJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return IPAMConfig{}, fmt.Errorf("decode ipam config: %w", err)
	}
	if j.MaxBlocksPerHost < 0 {
		return IPAMConfig{}, fmt.Errorf("decode ipam config: maxBlocksPerHost %d is negative", j.MaxBlocksPerHost)
	}
	c := IPAMConfig{StrictAffinity: j.StrictAffinity, AutoAllocateBlocks: true, MaxBlocksPerHost: j.MaxBlocksPerHost}
	if j.AutoAllocateBlocks != nil {
		c.AutoAllocateBlocks = *j.AutoAllocateBlocks
	}
	return c, nil
}

// EncodeIPAMConfig encodes the IPAM config as Calico writes it.
func EncodeIPAMConfig(c IPAMConfig) ([]byte, error) {
	auto := c.AutoAllocateBlocks
	return json.Marshal(ipamConfigJSON{StrictAffinity: c.StrictAffinity, AutoAllocateBlocks: &auto, MaxBlocksPerHost: c.MaxBlocksPerHost})
}

// BlockCap returns the effective maximum number of blocks per host when the request sets no limit of
// its own (see BlockLimit).
func (c IPAMConfig) BlockCap() int { return c.BlockLimit(0) }

// Default block sizes of IP pools.
const (
	DefaultBlockSizeV4 = 26
	DefaultBlockSizeV6 = 122
)

// IPPool is what the agent and block-ipam need of a Calico v3 IPPool resource (key IPPoolKey(Name)).
type IPPool struct {
	Name      string
	CIDR      netip.Prefix
	BlockSize int
	Disabled  bool
	// NodeSelector is the pool's Calico selector; "" and "all()" select every node.
	NodeSelector string
	// NamespaceSelector (v3.31+) selects the pods' namespaces; "" selects every namespace.
	NamespaceSelector string
	// AllowedUses lists "Workload", "Tunnel", "LoadBalancer"; empty means Workload and Tunnel.
	AllowedUses []string
	// AssignmentMode is "Automatic" (or empty) or "Manual" (v3.30+: never chosen automatically).
	AssignmentMode string
	// IPIPMode and VXLANMode are spec.ipipMode and spec.vxlanMode as written, an absent or empty one
	// as EncapNever. Encap reads them as felix does; EncapProblems lists what Calico would refuse. A
	// bad mode never fails the decode: allocators use the pool as usual.
	IPIPMode, VXLANMode EncapMode
}

type ipPoolJSON struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		CIDR           string   `json:"cidr"`
		BlockSize      int      `json:"blockSize,omitempty"`
		Disabled       bool     `json:"disabled,omitempty"`
		NodeSelector   string   `json:"nodeSelector,omitempty"`
		NSSelector     string   `json:"namespaceSelector,omitempty"`
		AllowedUses    []string `json:"allowedUses,omitempty"`
		AssignmentMode string   `json:"assignmentMode,omitempty"`
		// The modes are read raw so that a mode of the wrong JSON type is a problem of the mode
		// (IPPool.EncapProblems), not a pool that fails to decode.
		IPIPMode    json.RawMessage `json:"ipipMode,omitempty"`
		VXLANMode   json.RawMessage `json:"vxlanMode,omitempty"`
		NATOutgoing bool            `json:"natOutgoing,omitempty"`
	} `json:"spec"`
}

// DecodeIPPool decodes a v3 IPPool resource, applying the default block size, and checks that the CIDR
// is canonical and the block size fits the family and the pool.
func DecodeIPPool(data []byte) (IPPool, error) {
	var j ipPoolJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return IPPool{}, fmt.Errorf("decode ippool: %w", err)
	}
	p := IPPool{
		Name: j.Metadata.Name, BlockSize: j.Spec.BlockSize, Disabled: j.Spec.Disabled,
		NodeSelector: j.Spec.NodeSelector, NamespaceSelector: j.Spec.NSSelector, AllowedUses: j.Spec.AllowedUses,
		AssignmentMode: j.Spec.AssignmentMode,
		IPIPMode:       rawEncapMode(j.Spec.IPIPMode), VXLANMode: rawEncapMode(j.Spec.VXLANMode),
	}
	cidr, err := netip.ParsePrefix(j.Spec.CIDR)
	if err != nil {
		return IPPool{}, fmt.Errorf("decode ippool %q: spec.cidr: %w", p.Name, err)
	}
	p.CIDR = netaddr.Canonical(cidr)
	if p.BlockSize == 0 {
		p.BlockSize = DefaultBlockSizeV4
		if p.CIDR.Addr().Is6() {
			p.BlockSize = DefaultBlockSizeV6
		}
	}
	if err := p.Validate(); err != nil {
		return IPPool{}, fmt.Errorf("decode ippool %q: %w", p.Name, err)
	}
	return p, nil
}

// Validate checks that the pool's block size fits its family and its CIDR.
func (p IPPool) Validate() error {
	if !p.CIDR.IsValid() {
		return errors.New("spec.cidr is not set")
	}
	bits := p.CIDR.Addr().BitLen()
	min := 20
	if bits == 128 {
		min = 116
	}
	if p.BlockSize < min || p.BlockSize > bits {
		return fmt.Errorf("spec.blockSize %d out of range %d-%d", p.BlockSize, min, bits)
	}
	if p.BlockSize < p.CIDR.Bits() {
		return fmt.Errorf("spec.blockSize %d is larger than the pool %s", p.BlockSize, p.CIDR)
	}
	return nil
}

// EncodeIPPool encodes the pool as a v3 IPPool resource, as calicoctl would store it.
func EncodeIPPool(p IPPool) ([]byte, error) {
	var j ipPoolJSON
	j.Kind, j.APIVersion = "IPPool", "projectcalico.org/v3"
	j.Metadata.Name = p.Name
	j.Spec.CIDR = p.CIDR.String()
	j.Spec.BlockSize = p.BlockSize
	j.Spec.Disabled = p.Disabled
	j.Spec.NodeSelector = p.NodeSelector
	if j.Spec.NodeSelector == "" {
		j.Spec.NodeSelector = "all()"
	}
	j.Spec.NSSelector = p.NamespaceSelector
	j.Spec.AllowedUses = p.AllowedUses
	j.Spec.AssignmentMode = p.AssignmentMode
	j.Spec.IPIPMode, _ = json.Marshal(encapMode(string(p.IPIPMode)))
	j.Spec.VXLANMode, _ = json.Marshal(encapMode(string(p.VXLANMode)))
	return json.Marshal(j)
}

// encapMode reads a mode as written; empty is Never.
func encapMode(s string) EncapMode {
	if s == "" {
		return EncapNever
	}
	return EncapMode(s)
}

// rawEncapMode reads a mode from its JSON: a string as written, null or absent as Never, any other JSON
// value as its text (never a valid mode).
func rawEncapMode(raw json.RawMessage) EncapMode {
	var s string
	if len(raw) == 0 || string(raw) == "null" {
		return EncapNever
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return EncapMode(raw)
	}
	return encapMode(s)
}

// AllowsWorkloads reports whether pods may get addresses from the pool.
func (p IPPool) AllowsWorkloads() bool {
	if len(p.AllowedUses) == 0 {
		return true
	}
	for _, u := range p.AllowedUses {
		if u == "Workload" {
			return true
		}
	}
	return false
}

// Contains reports whether the prefix lies inside the pool.
func (p IPPool) Contains(cidr netip.Prefix) bool { return netaddr.Covers(p.CIDR, cidr) }

// Automatic reports whether the pool may be chosen without being asked for by name (assignmentMode).
func (p IPPool) Automatic() bool { return p.AssignmentMode == "" || p.AssignmentMode == "Automatic" }
