// Package cni is block-ipam's CNI side: the network configuration, the daemon's front door for the
// plugin's call (Decode: every CNI rule, checked once; Call.Render: the result in the configuration's
// CNI version) and the request the daemon (package cni/ipamd) serves. The plugin the
// runtime executes (package cni/shim) only forwards the call: it links none of this package.
// It holds no etcd code: the daemon reaches etcd through cni/ipamd.
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// IPAMConf is the "ipam" section of the network configuration. Field names follow calico-ipam where
// it has one. The etcd settings calico-ipam reads (etcd_endpoints, etcd_*_file) are accepted and
// ignored: the node daemon owns the connection to etcd.
type IPAMConf struct {
	Type string `json:"type"`

	// Socket is the daemon's unix socket (default DefaultSocket).
	Socket   string `json:"socket"`
	Nodename string `json:"nodename"`

	IPv4Pools  []string        `json:"ipv4_pools"`
	IPv6Pools  []string        `json:"ipv6_pools"`
	AssignIPv4 json.RawMessage `json:"assign_ipv4"`
	AssignIPv6 json.RawMessage `json:"assign_ipv6"`
	Exclude    []string        `json:"exclude"`

	Routes     []*types.Route `json:"routes"`
	DNS        *types.DNS     `json:"dns"`
	ResolvConf string         `json:"resolvConf"`
	Gateway    string         `json:"gateway"`
	Gateways   []string       `json:"gateways"`
	// ResultPrefix is "host" (default: /32, /128) or "block" (the block's mask).
	ResultPrefix string `json:"result_prefix"`

	MaxBlocksPerHost *int `json:"max_blocks_per_host"`

	LogFile  string `json:"log_file"`
	LogLevel string `json:"log_level"`
	Timeout  string `json:"timeout"`
}

// NetConf is the network configuration block-ipam reads on stdin. The node name may also stand at
// the top level, as calico-ipam reads it.
type NetConf struct {
	types.PluginConf
	IPAM *IPAMConf `json:"ipam"`

	Nodename string `json:"nodename"`

	RuntimeConfig struct {
		IPs []string `json:"ips"`
	} `json:"runtimeConfig"`
	Args struct {
		CNI struct {
			IPs []string `json:"ips"`
		} `json:"cni"`
	} `json:"args"`

	// ValidAttachments is GC's list, raw so that an absent key ("no information": release nothing)
	// is told from a present one; null, which libcni sends for GC args without attachments, is an
	// empty list.
	ValidAttachments json.RawMessage `json:"cni.dev/valid-attachments"`
	// LegacyAttachments is the key libcni also sends (spec erratum, cni#1101).
	LegacyAttachments json.RawMessage `json:"cni.dev/attachments"`
}

// parseBool accepts Calico's "true"/"false" strings as well as JSON booleans; absent gives def.
func parseBool(raw json.RawMessage, field string, def bool) (bool, *types.Error) {
	if len(raw) == 0 || string(raw) == "null" {
		return def, nil
	}
	switch strings.ToLower(strings.Trim(string(raw), `"`)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, configError(field, "want \"true\" or \"false\", got %s", raw)
}

// Families returns the families ADD assigns.
func (c *Request) Families() []netaddr.Family {
	var out []netaddr.Family
	for _, f := range []netaddr.Family{netaddr.V4, netaddr.V6} {
		if c.Assign[f] {
			out = append(out, f)
		}
	}
	return out
}

// Config is a validated configuration with every default applied: the Request the daemon serves
// (without the per-call verb, container and interface) and what only the shim uses.
type Config struct {
	Request
	CNIVersion string
	// Socket is the daemon's unix socket.
	Socket string

	Routes      []*types.Route
	DNS         types.DNS
	Gateways    [2]netip.Addr
	ResultBlock bool // result_prefix "block"
	LogFile     string
	LogLevel    string
}

// LoadConfig parses and validates the network configuration and the CNI_ARGS of one call of verb
// (the Config's Verb), as Decode does. It opens no connection and reads no file but resolvConf, for
// ADD only: the other verbs do not print DNS, and DEL must release whatever became of the file.
// Errors are *types.Error: 6 for JSON that is not JSON, 1 for a cniVersion the verb or block-ipam
// does not allow, 7 naming the field of an invalid setting, 4 for a malformed CNI_ARGS.
func LoadConfig(verb string, stdin []byte, cniArgs string) (*Config, error) {
	c, err := loadConfig(verb, stdin, cniArgs, shim.ReadResolvConf)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// loadConfig is LoadConfig with resolvConf read by resolv (the daemon is given the file's content by
// the plugin, which runs in the runtime's mount namespace). The configuration is decoded once: a
// field of the wrong type is reported after the name and the cniVersion, which decode regardless.
func loadConfig(verb string, stdin []byte, cniArgs string, resolv func(path string) ([]byte, error)) (*Config, *types.Error) {
	var n NetConf
	typeErr := json.Unmarshal(stdin, &n)
	var te *json.UnmarshalTypeError
	field := ""
	if errors.As(typeErr, &te) {
		field = strings.TrimPrefix(te.Field, "PluginConf.") // the embedded struct's keys are top-level keys
	}
	if typeErr != nil && (field == "" || field == "name" || field == "cniVersion") {
		return nil, &types.Error{Code: types.ErrDecodingFailure, Msg: "decoding the network configuration: " + typeErr.Error()}
	}
	switch {
	case n.Name == "":
		return nil, configError("name", "missing network name")
	case utils.ValidateNetworkName(n.Name) != nil:
		return nil, configError("name", "%q: %s", n.Name, utils.ValidateNetworkName(n.Name).Msg)
	}
	if err := checkVersion(verb, n.CNIVersion); err != nil {
		return nil, err
	}
	if typeErr != nil {
		return nil, configError(field, "%v", typeErr)
	}
	if n.IPAM == nil {
		return nil, configError("ipam", "missing: block-ipam reads its settings from the ipam section")
	}
	im := n.IPAM
	c := &Config{Request: Request{Verb: verb, Network: n.Name}, CNIVersion: n.CNIVersion}
	var err *types.Error

	c.Socket = strings.TrimSpace(im.Socket)
	switch {
	case c.Socket == "":
		c.Socket = DefaultSocket
	case shim.CheckSocketPath(c.Socket) != "":
		return nil, configError("ipam.socket", "%s", shim.CheckSocketPath(c.Socket))
	}
	// A node name in the configuration (calico-ipam's field) must be the daemon's: the daemon checks.
	field = "ipam.nodename"
	if c.Node = strings.TrimSpace(im.Nodename); c.Node == "" {
		field, c.Node = "nodename", strings.TrimSpace(n.Nodename)
	}
	if c.Node != "" {
		if err := calico.CheckNodeName(c.Node); err != nil {
			return nil, configError(field, "%v", err)
		}
	}

	// Pools and families.
	if c.Assign[netaddr.V4], err = parseBool(im.AssignIPv4, "ipam.assign_ipv4", true); err != nil {
		return nil, err
	}
	if c.Assign[netaddr.V6], err = parseBool(im.AssignIPv6, "ipam.assign_ipv6", false); err != nil {
		return nil, err
	}
	for f, list := range [2][]string{im.IPv4Pools, im.IPv6Pools} {
		field := "ipam." + netaddr.Family(f).String() + "_pools"
		for i, s := range list {
			ref, err := parsePoolRef(s, netaddr.Family(f))
			if err != nil {
				return nil, configError(fmt.Sprintf("%s[%d]", field, i), "%v", err)
			}
			c.Pools[f] = append(c.Pools[f], ref)
		}
	}
	for i, s := range im.Exclude {
		p, err := calico.ParsePrefixOrAddr(s)
		if err != nil {
			return nil, configError(fmt.Sprintf("ipam.exclude[%d]", i), "%v", err)
		}
		c.Exclude = append(c.Exclude, p)
	}

	// Result contents.
	for i, r := range im.Routes {
		if r == nil || r.Dst.IP == nil {
			return nil, configError(fmt.Sprintf("ipam.routes[%d]", i), "missing dst")
		}
	}
	c.Routes = im.Routes
	switch {
	case im.DNS != nil:
		c.DNS = *im.DNS
	case im.ResolvConf != "" && verb == "ADD":
		data, err := resolv(im.ResolvConf)
		if err != nil {
			return nil, configError("ipam.resolvConf", "%v", err)
		}
		c.DNS = parseResolvConf(data)
	}
	gws := im.Gateways
	if im.Gateway != "" {
		gws = append([]string{im.Gateway}, gws...)
	}
	for i, g := range gws {
		field := fmt.Sprintf("ipam.gateways[%d]", i)
		if im.Gateway != "" {
			field = "ipam.gateway"
			if i > 0 {
				field = fmt.Sprintf("ipam.gateways[%d]", i-1)
			}
		}
		a, err := netip.ParseAddr(strings.TrimSpace(g))
		if err != nil || a.Zone() != "" {
			return nil, configError(field, "%q is not an IP address", g)
		}
		a = a.Unmap()
		if c.Gateways[netaddr.FamilyOf(a)].IsValid() {
			return nil, configError(field, "a second %s gateway", netaddr.FamilyOf(a))
		}
		c.Gateways[netaddr.FamilyOf(a)] = a
	}
	switch im.ResultPrefix {
	case "", "host":
	case "block":
		c.ResultBlock = true
	default:
		return nil, configError("ipam.result_prefix", "%q is neither \"host\" nor \"block\"", im.ResultPrefix)
	}
	if im.MaxBlocksPerHost != nil {
		if *im.MaxBlocksPerHost < 0 {
			return nil, configError("ipam.max_blocks_per_host", "%d is negative", *im.MaxBlocksPerHost)
		}
		c.MaxBlocks = *im.MaxBlocksPerHost
	}

	// Operation.
	c.LogFile = im.LogFile
	switch c.LogLevel = strings.ToLower(im.LogLevel); c.LogLevel {
	case "":
		c.LogLevel = "info"
	case "debug", "info", "warn", "warning", "error":
	default:
		return nil, configError("ipam.log_level", "%q is not one of debug, info, warn, error", im.LogLevel)
	}
	var ok bool
	if c.Timeout, ok = shim.CallTimeout(verb, im.Timeout); !ok {
		return nil, configError("ipam.timeout", "%q is not a positive duration such as \"30s\"", im.Timeout)
	}

	// Specific addresses: capability ips, then args.cni.ips, then CNI_ARGS IP=.
	var args map[string]string
	args, err = parseCNIArgs(cniArgs)
	if err != nil {
		return nil, err
	}
	c.Namespace, c.Pod = args["K8S_POD_NAMESPACE"], args["K8S_POD_NAME"]
	reqField, req := "runtimeConfig.ips", n.RuntimeConfig.IPs
	if len(req) == 0 {
		reqField, req = "args.cni.ips", n.Args.CNI.IPs
	}
	if len(req) == 0 && args["IP"] != "" {
		reqField, req = "CNI_ARGS IP", strings.Split(args["IP"], ",")
	}
	for i, s := range req {
		p, err := calico.ParsePrefixOrAddr(s)
		if reqField == "CNI_ARGS IP" && err == nil && strings.Contains(s, "/") {
			// calico-ipam's IP= is an address; a prefix length here is a typo that must not pass.
			err = fmt.Errorf("%q has a prefix length: IP= takes addresses only", s)
		}
		if err != nil {
			if reqField == "CNI_ARGS IP" {
				return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("CNI_ARGS IP: %v", err)}
			}
			return nil, configError(fmt.Sprintf("%s[%d]", reqField, i), "%v", err)
		}
		// "10.0.0.5/24" asks for 10.0.0.5: the mask is the runtime's business.
		a, _ := netip.ParseAddr(strings.SplitN(strings.TrimSpace(s), "/", 2)[0])
		if !a.IsValid() {
			a = p.Addr()
		}
		a = a.Unmap()
		if slices.Contains(c.RequestedIPs, a) {
			return nil, configError(fmt.Sprintf("%s[%d]", reqField, i), "%s requested twice", a)
		}
		c.RequestedIPs = append(c.RequestedIPs, a)
	}
	if !c.Assign[netaddr.V4] && !c.Assign[netaddr.V6] && len(c.RequestedIPs) == 0 {
		return nil, configError("ipam.assign_ipv4", "both assign_ipv4 and assign_ipv6 are false: nothing to assign")
	}

	if n.RawPrevResult != nil {
		if err := version.ParsePrevResult(&n.PluginConf); err != nil {
			return nil, configError("prevResult", "%v", err)
		}
		prev, err := current.NewResultFromResult(n.PrevResult)
		if err != nil {
			return nil, configError("prevResult", "%v", err)
		}
		for _, ip := range prev.IPs {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				c.PrevIPs = append(c.PrevIPs, a.Unmap())
			}
		}
	}
	for _, a := range []struct {
		field string
		raw   json.RawMessage
	}{{"cni.dev/valid-attachments", n.ValidAttachments}, {"cni.dev/attachments", n.LegacyAttachments}} {
		if len(a.raw) == 0 {
			continue
		}
		if err := json.Unmarshal(a.raw, &c.ValidAttachments); err != nil {
			return nil, configError(a.field, "%v", err)
		}
		c.HaveAttachments = true
		break
	}
	return c, nil
}

// parsePoolRef parses a pool reference of family f: a canonical CIDR of that family, or a pool name.
func parsePoolRef(s string, f netaddr.Family) (PoolRef, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return PoolRef{}, err
		}
		if p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return PoolRef{}, fmt.Errorf("%q: zones and IPv4-mapped prefixes are not pools", s)
		}
		if p != p.Masked() {
			return PoolRef{}, fmt.Errorf("%q has host bits set (the pool is %s)", s, p.Masked())
		}
		if netaddr.FamilyOf(p.Addr()) != f {
			return PoolRef{}, fmt.Errorf("%q is not an %s prefix", s, f)
		}
		return PoolRef{CIDR: p}, nil
	}
	if s == "" || strings.ContainsAny(s, " \x00") {
		return PoolRef{}, fmt.Errorf("%q is neither a CIDR nor a pool name", s)
	}
	return PoolRef{Name: s}, nil
}

// parseCNIArgs parses CNI_ARGS ("K=V;K2=V2"), keeping every key: unlike types.LoadArgs it accepts
// keys it does not know, as kubelet sends several.
func parseCNIArgs(s string) (map[string]string, *types.Error) {
	out := map[string]string{}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("CNI_ARGS: %q is not KEY=VALUE", pair)}
		}
		if _, dup := out[k]; dup {
			return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("CNI_ARGS: %s given twice", k)}
		}
		out[k] = v
	}
	return out, nil
}

// parseResolvConf takes nameserver, domain, search and options from a resolv.conf file's content.
func parseResolvConf(data []byte) types.DNS {
	var dns types.DNS
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if ip := net.ParseIP(f[1]); ip != nil {
				dns.Nameservers = append(dns.Nameservers, f[1])
			}
		case "domain":
			dns.Domain = f[1]
		case "search":
			dns.Search = append(dns.Search, f[1:]...)
		case "options":
			dns.Options = append(dns.Options, f[1:]...)
		}
	}
	return dns
}

// Result builds the CNI result for the allocations: host prefixes (or the block's mask), the family's
// gateway, the configured routes and DNS.
func (c *Config) Result(allocs []Allocation) *current.Result {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: c.Routes, DNS: c.DNS}
	for _, a := range allocs {
		bits := a.Addr.BitLen()
		if c.ResultBlock {
			bits = a.Block.Bits()
		}
		ipc := &current.IPConfig{Address: net.IPNet{IP: net.IP(a.Addr.AsSlice()), Mask: net.CIDRMask(bits, a.Addr.BitLen())}}
		if gw := c.Gateways[netaddr.FamilyOf(a.Addr)]; gw.IsValid() {
			ipc.Gateway = net.IP(gw.AsSlice())
		}
		res.IPs = append(res.IPs, ipc)
	}
	return res
}

func resultIPs(r *current.Result) string {
	var s []string
	for _, ip := range r.IPs {
		s = append(s, ip.Address.String())
	}
	return strings.Join(s, ",")
}
