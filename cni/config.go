// Package cni is block-ipam, a CNI IPAM plugin that hands pods addresses from Calico IPAM blocks
// affine to the node and claims new blocks in etcd, writing exactly the keys and values Calico writes
// (see ../calico), so that Calico's own tools and the route agent on every node read the result.
//
// Every change is one conditional etcd transaction: a block and the handle that holds its addresses,
// a new block and its confirmed affinity, are written together or not at all, and a lost race is
// retried with jittered backoff under the operation's deadline. A per-node file lock serialises the
// plugin's own processes so that they do not race each other; correctness never depends on it.
package cni

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Defaults of the configuration.
const (
	// DefaultNodenameFile is where calico/node records the node name.
	DefaultNodenameFile = "/var/lib/calico/nodename"
	// DefaultLockDir holds the per-node lock files (<dir>/<node>.lock).
	DefaultLockDir = "/var/run/block-ipam"
	// DefaultTimeout bounds one plugin call, retries included.
	DefaultTimeout = 30 * time.Second
	// statusTimeout bounds STATUS's reachability probe of etcd.
	statusTimeout = 2 * time.Second
	// callTimeout bounds one etcd round trip.
	callTimeout = 5 * time.Second
)

// IPAMConf is the "ipam" section of the network configuration. Field names follow calico-ipam where
// it has one.
type IPAMConf struct {
	Type string `json:"type"`

	EtcdEndpoints  string `json:"etcd_endpoints"`
	EtcdCACertFile string `json:"etcd_ca_cert_file"`
	EtcdCertFile   string `json:"etcd_cert_file"`
	EtcdKeyFile    string `json:"etcd_key_file"`
	Nodename       string `json:"nodename"`
	NodenameFile   string `json:"nodename_file"`

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
	LockFile string `json:"lock_file"`
	Timeout  string `json:"timeout"`
}

// NetConf is the network configuration block-ipam reads on stdin. The etcd and node settings may
// also stand at the top level, as calico-ipam reads them.
type NetConf struct {
	types.PluginConf
	IPAM *IPAMConf `json:"ipam"`

	EtcdEndpoints  string `json:"etcd_endpoints"`
	EtcdCACertFile string `json:"etcd_ca_cert_file"`
	EtcdCertFile   string `json:"etcd_cert_file"`
	EtcdKeyFile    string `json:"etcd_key_file"`
	Nodename       string `json:"nodename"`
	NodenameFile   string `json:"nodename_file"`

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
func parseBool(raw json.RawMessage, field string, def bool) (bool, error) {
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

// Family indexes per-family settings.
type Family int

// The two address families.
const (
	V4 Family = iota
	V6
)

// String returns "ipv4" or "ipv6", the word Calico uses in its keys and block-ipam in its settings.
func (f Family) String() string {
	if f == V6 {
		return "ipv6"
	}
	return "ipv4"
}

func familyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return V4
	}
	return V6
}

// families returns the families ADD assigns.
func (c *Config) families() []Family {
	var out []Family
	for _, f := range []Family{V4, V6} {
		if c.Assign[f] {
			out = append(out, f)
		}
	}
	return out
}

// PoolRef names a pool in the configuration: a CIDR or the name of a Calico IPPool.
type PoolRef struct {
	CIDR netip.Prefix // set when the reference is a CIDR
	Name string       // set when it is a pool name
}

// Config is a validated configuration with every default and fall-back applied.
type Config struct {
	Network    string
	CNIVersion string

	Endpoints []string
	// TLS names the etcd client's PEM files; tls is what LoadConfig built from them (nil: none).
	TLS  TLSFiles
	tls  *tls.Config
	Node string

	// Assign says which families ADD allocates automatically.
	Assign [2]bool
	// Pools lists the configured pools of each family; nil means every enabled, automatic pool.
	Pools [2][]PoolRef
	// Exclude are ranges never handed out.
	Exclude []netip.Prefix

	Routes       []*types.Route
	DNS          types.DNS
	Gateways     [2]netip.Addr
	ResultBlock  bool // result_prefix "block"
	MaxBlocks    int  // 0: from Calico's IPAM config
	LogFile      string
	LogLevel     string
	LockFile     string // "" disables the lock
	Timeout      time.Duration
	RequestedIPs []netip.Addr

	// PrevResult is CHECK's prevResult, nil when absent.
	PrevResult types.Result
	// ValidAttachments is GC's list, nil when the key is absent.
	ValidAttachments []types.GCAttachment
	// HaveAttachments tells an absent GC list from an empty one.
	HaveAttachments bool

	// Namespace and Pod come from CNI_ARGS.
	Namespace, Pod string
}

// LoadConfig parses and validates the network configuration and the CNI_ARGS of one call. It opens
// no connection; it reads only local files (TLS material, the node name file, resolvConf). getenv
// supplies environment fall-backs; hostname is the last resort for the node name. Errors are
// *types.Error with code 7 naming the field (4 for a malformed CNI_ARGS).
func LoadConfig(stdin []byte, cniArgs string, getenv func(string) string, hostname func() (string, error)) (*Config, error) {
	var n NetConf
	err := json.Unmarshal(stdin, &n)
	if err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, configError(te.Field, "%v", err)
		}
		return nil, &types.Error{Code: types.ErrDecodingFailure, Msg: "decoding network configuration: " + err.Error()}
	}
	if n.IPAM == nil {
		return nil, configError("ipam", "missing: block-ipam reads its settings from the ipam section")
	}
	im := n.IPAM
	c := &Config{Network: n.Name, CNIVersion: n.CNIVersion}
	if c.Network == "" {
		return nil, configError("name", "missing network name")
	}
	if err := utils.ValidateNetworkName(c.Network); err != nil {
		return nil, configError("name", "%s", err.Msg)
	}

	// etcd: ipam section, then top level, then environment.
	pick := func(vals ...string) string {
		for _, v := range vals {
			if v = strings.TrimSpace(v); v != "" {
				return v
			}
		}
		return ""
	}
	eps := pick(im.EtcdEndpoints, n.EtcdEndpoints, getenv("ETCD_ENDPOINTS"))
	if eps == "" {
		return nil, configError("etcd_endpoints", "missing (set it in ipam, at the top level, or in ETCD_ENDPOINTS)")
	}
	for i, e := range strings.Split(eps, ",") {
		e = strings.TrimRight(strings.TrimSpace(e), "/")
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, configError("etcd_endpoints", "entry %d %q is not an http:// or https:// URL", i, e)
		}
		c.Endpoints = append(c.Endpoints, e)
	}
	c.TLS = TLSFiles{
		CACertFile: pick(im.EtcdCACertFile, n.EtcdCACertFile, getenv("ETCD_CA_CERT_FILE")),
		CertFile:   pick(im.EtcdCertFile, n.EtcdCertFile, getenv("ETCD_CERT_FILE")),
		KeyFile:    pick(im.EtcdKeyFile, n.EtcdKeyFile, getenv("ETCD_KEY_FILE")),
	}
	if c.TLS != (TLSFiles{}) {
		// Load the files now, so that a bad one fails as configuration before any etcd call.
		if c.tls, err = loadTLS(c.TLS); err != nil {
			return nil, err
		}
	}

	// Node name: nodename, NODENAME, the node name file, the lower-cased hostname.
	c.Node = pick(im.Nodename, n.Nodename, getenv("NODENAME"))
	nodeField := "nodename"
	if c.Node == "" {
		file := pick(im.NodenameFile, n.NodenameFile, DefaultNodenameFile)
		if data, err := os.ReadFile(file); err == nil {
			c.Node = strings.TrimSpace(string(data))
			nodeField = "nodename_file"
		}
	}
	if c.Node == "" {
		h, err := hostname()
		if err != nil {
			return nil, configError("nodename", "not set and the hostname is unknown: %v", err)
		}
		c.Node, nodeField = strings.ToLower(strings.TrimSpace(h)), "nodename (from the hostname)"
	}
	if c.Node == "" || strings.ContainsAny(c.Node, "/\x00 ") || c.Node == "." || c.Node == ".." {
		return nil, configError(nodeField, "%q is not a valid node name", c.Node)
	}

	// Pools and families.
	if c.Assign[V4], err = parseBool(im.AssignIPv4, "ipam.assign_ipv4", true); err != nil {
		return nil, err
	}
	if c.Assign[V6], err = parseBool(im.AssignIPv6, "ipam.assign_ipv6", false); err != nil {
		return nil, err
	}
	for f, list := range [2][]string{im.IPv4Pools, im.IPv6Pools} {
		field := "ipam." + Family(f).String() + "_pools"
		for i, s := range list {
			ref, err := parsePoolRef(s, Family(f))
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
	case im.ResolvConf != "":
		dns, err := parseResolvConf(im.ResolvConf)
		if err != nil {
			return nil, configError("ipam.resolvConf", "%v", err)
		}
		c.DNS = dns
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
		if c.Gateways[familyOf(a)].IsValid() {
			return nil, configError(field, "a second %s gateway", familyOf(a))
		}
		c.Gateways[familyOf(a)] = a
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
	switch im.LockFile {
	case "":
		c.LockFile = DefaultLockDir + "/" + c.Node + ".lock"
	case "none":
	default:
		c.LockFile = im.LockFile
	}
	c.Timeout = DefaultTimeout
	if im.Timeout != "" {
		d, err := time.ParseDuration(im.Timeout)
		if err != nil || d <= 0 {
			return nil, configError("ipam.timeout", "%q is not a positive duration such as \"30s\"", im.Timeout)
		}
		c.Timeout = d
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
	if !c.Assign[V4] && !c.Assign[V6] && len(c.RequestedIPs) == 0 {
		return nil, configError("ipam.assign_ipv4", "both assign_ipv4 and assign_ipv6 are false: nothing to assign")
	}

	if n.RawPrevResult != nil {
		if err := version.ParsePrevResult(&n.PluginConf); err != nil {
			return nil, configError("prevResult", "%v", err)
		}
		c.PrevResult = n.PrevResult
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
func parsePoolRef(s string, f Family) (PoolRef, error) {
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
		if familyOf(p.Addr()) != f {
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
func parseCNIArgs(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, &types.Error{Code: types.ErrInvalidEnvironmentVariables, Msg: fmt.Sprintf("CNI_ARGS: %q is not KEY=VALUE", pair)}
		}
		out[k] = v
	}
	return out, nil
}

// parseResolvConf reads nameserver, domain, search and options from a resolv.conf file.
func parseResolvConf(path string) (types.DNS, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return types.DNS{}, err
	}
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
	return dns, nil
}
