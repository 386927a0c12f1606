// Package flagenv is what the two daemons (vpp-route-agent, block-ipamd) share on their command line:
// every flag falls back to an environment variable (Calico's name where Calico has one: NODENAME,
// ETCD_ENDPOINTS..., else the daemon's prefix and the flag's name), and the node name is found in
// Calico's order.
package flagenv

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// NodenameFile is where calico/node records the node name.
const NodenameFile = "/var/lib/calico/nodename"

// Env names the environment fall-backs of one daemon's flags.
type Env struct {
	// Prefix is put before the upper-cased flag name of a flag Calico has no name for:
	// "BLOCK_IPAM_" makes --max-connections BLOCK_IPAM_MAX_CONNECTIONS.
	Prefix string
	// Calico maps flags to the names Calico gives the same setting; --nodename is always NODENAME.
	Calico map[string]string
}

// Name returns the environment variable flag falls back to.
func (e Env) Name(flag string) string {
	if flag == "nodename" {
		return "NODENAME"
	}
	if n, ok := e.Calico[flag]; ok {
		return n
	}
	return e.Prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bound reports whether f has an environment fall-back: not --help, --version or a deprecated flag.
func bound(f *pflag.Flag) bool {
	return f.Name != "help" && f.Name != "version" && f.Deprecated == ""
}

// Annotate adds "(env NAME)" to the usage of each flag with a fall-back, so that --help documents it.
func (e Env) Annotate(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if bound(f) {
			f.Usage += " (env " + e.Name(f.Name) + ")"
		}
	})
}

// Apply sets every flag not given on the command line, except those named, from its environment
// variable when that is set and not empty. Repeatable flags take a comma-separated list.
func (e Env) Apply(fs *pflag.FlagSet, lookup func(string) (string, bool), except ...string) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if !bound(f) || f.Changed || slices.Contains(except, f.Name) {
			return
		}
		name := e.Name(f.Name)
		if v, ok := lookup(name); ok && v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("environment %s (for --%s): %w", name, f.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

// NodeName applies Calico's order: flag (--nodename, or $NODENAME already applied), else the contents
// of file (NodenameFile), else the lower-cased hostname. The name must pass calico.CheckNodeName.
func NodeName(flag, file string) (string, error) {
	name, from := strings.TrimSpace(flag), "--nodename or $NODENAME"
	if name == "" {
		if b, err := os.ReadFile(file); err == nil {
			name, from = strings.TrimSpace(string(b)), file
		}
	}
	if name == "" {
		h, err := os.Hostname()
		if err != nil || strings.TrimSpace(h) == "" {
			return "", fmt.Errorf("--nodename: not set and the hostname is unknown: %v", err)
		}
		name, from = strings.ToLower(strings.TrimSpace(h)), "the hostname"
	}
	if err := calico.CheckNodeName(name); err != nil {
		return "", fmt.Errorf("--nodename (from %s): %w", from, err)
	}
	return name, nil
}
