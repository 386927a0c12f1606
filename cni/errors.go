package cni

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// CNI error codes block-ipam returns. Codes 1-11 are the spec's (types.Err*); 50 and 51 are the
// spec's STATUS codes, which cni v1.3.0 has no constants for; 100 and up are block-ipam's own.
const (
	// ErrPluginNotAvailable (50, STATUS): the plugin cannot serve ADD now (daemon unreachable, etcd
	// lost, no address left to give).
	ErrPluginNotAvailable uint = shim.ErrPluginNotAvailable
	// ErrLimitedConnectivity (51, STATUS): existing containers may lose connectivity. Not returned by
	// block-ipam; defined for completeness.
	ErrLimitedConnectivity uint = 51
	// ErrPoolExhausted (100): no free address in the node's blocks, no block left to claim, and
	// borrowing is impossible (strict affinity, or every block of the pools is full).
	ErrPoolExhausted uint = 100
	// ErrAddressUnavailable (101): a requested address is held by another container, excluded,
	// outside the pools, or in another node's block while strict affinity is on.
	ErrAddressUnavailable uint = 101
	// ErrDatastore (102): etcd holds a value block-ipam must change but cannot decode, or refuses a
	// request permanently.
	ErrDatastore uint = 102
	// ErrCheckFailed (103): CHECK found the container's reservation missing or different.
	ErrCheckFailed uint = 103
)

// configError is the error of an invalid network configuration (code 7); field names the offending
// key as it is spelled in the configuration, e.g. "ipam.ipv4_pools[1]".
func configError(field, format string, args ...any) *types.Error {
	return ConfigError(field, format, args...)
}

// ConfigError is configError for the daemon, which checks the configuration against etcd.
func ConfigError(field, format string, args ...any) *types.Error {
	return &types.Error{Code: types.ErrInvalidNetworkConfig, Msg: field + ": " + fmt.Sprintf(format, args...)}
}
