package vppapi

import (
	"errors"
	"fmt"
	"strings"

	"go.fd.io/govpp/core"
)

var (
	// ErrNotConnected is returned by every call made while Run has no connection to VPP, and wrapped by
	// the errors of requests cut short because the connection was lost.
	ErrNotConnected = errors.New("not connected to VPP")

	// ErrTimeout is wrapped by the errors of requests VPP did not answer within Config.ReplyTimeout. It is
	// GoVPP's own core.ErrReplyTimeout, so errors.Is matches both.
	ErrTimeout = core.ErrReplyTimeout

	// ErrNoInterface is wrapped by SetupUplink's error when VPP has no interface of the given name or
	// index. For an index it comes with api.INVALID_SW_IF_INDEX, what VPP itself answers to a write on it.
	ErrNoInterface = errors.New("no such interface")

	// ErrUnsupported is wrapped by DumpAPIRoutes' error when the connected VPP has no ip_route_v2_dump.
	ErrUnsupported = errors.New("not supported by this VPP")
)

var (
	_ error = RouteError{}
	_ error = (*IncompatibleError)(nil)
)

// IncompatibleError reports a VPP that lacks messages (by name and CRC) this package uses: an API change
// this build of the agent cannot drive. Run reports it in an Incompatible event and keeps retrying.
type IncompatibleError struct {
	// Version is VPP's version, or "unknown" if show_version itself is incompatible.
	Version string
	// Messages are the missing messages as name_crc, like "ip_route_add_del_b8ecfe0d".
	Messages []string
	// Err is GoVPP's *api.CompatibilityError.
	Err error
}

// Error names the VPP version and the missing messages.
func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("VPP %s is incompatible with this agent: it lacks %d of the messages used: %s",
		e.Version, len(e.Messages), strings.Join(e.Messages, ", "))
}

// Unwrap returns GoVPP's compatibility error.
func (e *IncompatibleError) Unwrap() error { return e.Err }
