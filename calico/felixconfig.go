package calico

import (
	"encoding/json"
	"fmt"
	"strings"
)

// FelixConfigurationPrefix holds Calico's FelixConfiguration resources: "default" for the cluster and
// "node.<node>" for one node's overrides (libcalico-go lib/backend/syncersv1/updateprocessors
// configurationprocessor.go).
const FelixConfigurationPrefix = "/calico/resources/v3/projectcalico.org/felixconfigurations/"

// The FelixConfiguration names felix reads.
const (
	FelixConfigurationDefault  = "default"
	felixConfigurationNodeName = "node."
)

// Calico's VXLAN defaults (felix/config/config_params.go; api/pkg/apis/projectcalico/v3/felixconfig.go
// "[Default: 4789]", "[Default: 4096]").
const (
	DefaultVXLANPort = 4789
	DefaultVXLANVNI  = 4096
)

// FelixConfigurationKey returns the etcd key of the named FelixConfiguration.
func FelixConfigurationKey(name string) string { return FelixConfigurationPrefix + name }

// FelixConfigurationNodeName returns the name of node's FelixConfiguration override.
func FelixConfigurationNodeName(node string) string { return felixConfigurationNodeName + node }

// FelixConfiguration is what the route agent reads of a Calico v3 FelixConfiguration resource: the
// settings of the tunnels it builds. A nil field is unset (the next layer, or Calico's default, applies).
type FelixConfiguration struct {
	Name string
	// VXLANPort, VXLANVNI: spec.vxlanPort (1-65535), spec.vxlanVNI (0-16777215, 24 bits).
	VXLANPort, VXLANVNI *int
	// VXLANMTU, VXLANMTUV6, IPIPMTU: spec.vxlanMTU, vxlanMTUV6, ipipMTU; 0 means "detect" (host MTU
	// minus the encapsulation's overhead, Encap.Overhead).
	VXLANMTU, VXLANMTUV6, IPIPMTU *int
	// Problems lists the fields that did not parse or are out of range; each such field is left nil.
	// felix itself ignores a value it cannot parse; a router should keep the tunnel settings it had
	// while the resource has problems (never tear tunnels down for a typo).
	Problems []FieldProblem
}

// DecodeFelixConfiguration decodes a v3 FelixConfiguration resource. Only a value that is not JSON, or
// whose metadata does not decode, is an error: a bad field is listed in Problems and the rest decodes.
func DecodeFelixConfiguration(data []byte) (FelixConfiguration, error) {
	var j struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return FelixConfiguration{}, fmt.Errorf("decode felixconfiguration: %w", err)
	}
	c := FelixConfiguration{Name: j.Metadata.Name}
	bad := func(field, value, reason string) {
		c.Problems = append(c.Problems, FieldProblem{Kind: "FelixConfiguration", Name: c.Name, Field: field, Value: value, Reason: reason})
	}
	spec, ok := object(j.Spec)
	if !ok {
		bad("spec", string(j.Spec), "not a JSON object")
		return c, nil
	}
	num := func(key string, lo, hi int, zeroOK bool) *int {
		raw, ok := spec[key]
		if !ok || string(raw) == "null" {
			return nil
		}
		var v int
		if err := json.Unmarshal(raw, &v); err != nil {
			bad("spec."+key, string(raw), "not an integer")
			return nil
		}
		if (v < lo || v > hi) && !(zeroOK && v == 0) {
			bad("spec."+key, string(raw), fmt.Sprintf("out of range %d-%d", lo, hi))
			return nil
		}
		return &v
	}
	c.VXLANPort = num("vxlanPort", 1, 65535, false)
	c.VXLANVNI = num("vxlanVNI", 0, 1<<24-1, false)
	// An MTU is 0 (detect) or at least the family's minimum link MTU (RFC 791: 68; RFC 8200: 1280).
	c.VXLANMTU = num("vxlanMTU", 68, 65535, true)
	c.VXLANMTUV6 = num("vxlanMTUV6", 1280, 65535, true)
	c.IPIPMTU = num("ipipMTU", 68, 65535, true)
	return c, nil
}

// TunnelConfig is the effective tunnel configuration of one node: its override over the cluster's
// default over Calico's defaults.
type TunnelConfig struct {
	VXLANPort int
	VXLANVNI  int
	// MTUs; 0 means "detect" (the uplink MTU minus Encap.Overhead).
	VXLANMTU, VXLANMTUV6, IPIPMTU int
}

// EffectiveTunnelConfig merges FelixConfigurations the way felix layers them: a field set in node (the
// node.<name> resource) wins over one set in global (default), which wins over Calico's default. Either
// may be nil (absent). A field listed in a resource's Problems is unset there, so it falls through; the
// caller decides whether to use the result while problems remain (see FelixConfiguration.Problems).
func EffectiveTunnelConfig(global, node *FelixConfiguration) TunnelConfig {
	c := TunnelConfig{VXLANPort: DefaultVXLANPort, VXLANVNI: DefaultVXLANVNI}
	for _, l := range []*FelixConfiguration{global, node} {
		if l == nil {
			continue
		}
		set := func(dst *int, v *int) {
			if v != nil {
				*dst = *v
			}
		}
		set(&c.VXLANPort, l.VXLANPort)
		set(&c.VXLANVNI, l.VXLANVNI)
		set(&c.VXLANMTU, l.VXLANMTU)
		set(&c.VXLANMTUV6, l.VXLANMTUV6)
		set(&c.IPIPMTU, l.IPIPMTU)
	}
	return c
}

// FelixConfigurationNode returns the node a FelixConfiguration name overrides ("node.<node>"), and
// false for any other name ("default", or a name felix does not read).
func FelixConfigurationNode(name string) (string, bool) {
	node, ok := strings.CutPrefix(name, felixConfigurationNodeName)
	return node, ok && node != ""
}

// MTU returns the MTU of routes encapsulated with e in a family: the configured one (ipipMTU,
// vxlanMTU, vxlanMTUV6), or, where it is 0, the uplink's MTU less e's overhead, as felix derives it
// (felix/dataplane/linux/int_dataplane.go). Unencapsulated routes get the uplink's MTU.
func (c TunnelConfig) MTU(e Encap, v6 bool, uplinkMTU int) int {
	configured := 0
	switch {
	case e == EncapIPIP:
		configured = c.IPIPMTU
	case e == EncapVXLAN && v6:
		configured = c.VXLANMTUV6
	case e == EncapVXLAN:
		configured = c.VXLANMTU
	}
	if configured != 0 {
		return configured
	}
	return uplinkMTU - e.Overhead(v6)
}
