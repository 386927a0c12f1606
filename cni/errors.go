package cni

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// CNI error codes block-ipam returns. Codes 1-11 are the spec's (types.Err*); 50 and 51 are the
// spec's STATUS codes, which cni v1.3.0 has no constants for; 100 and up are block-ipam's own.
const (
	// ErrPluginNotAvailable (50, STATUS): the plugin cannot serve ADD now (etcd unreachable, no
	// address left to give).
	ErrPluginNotAvailable uint = 50
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

// cniError returns a *types.Error with the given code; the message is formatted like fmt.Errorf
// but a *types.Error does not wrap, so callers keep the cause in the text.
func cniError(code uint, format string, args ...any) *types.Error {
	return &types.Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// configError is the error of an invalid network configuration (code 7); field names the offending
// key as it is spelled in the configuration, e.g. "ipam.ipv4_pools[1]".
func configError(field, format string, args ...any) *types.Error {
	return &types.Error{Code: types.ErrInvalidNetworkConfig, Msg: field + ": " + fmt.Sprintf(format, args...)}
}

// Sentinel and typed errors of the allocator; toCNIError maps them to codes at the verb boundary.
var (
	// errConflict: a conditional write lost to a concurrent writer; the operation is retried.
	errConflict = errors.New("etcd transaction lost a race with a concurrent write")
	// errUnavailable: no etcd endpoint answered; retried until the deadline.
	errUnavailable = errors.New("etcd unavailable")
)

// codedError carries a CNI code through %w wrapping inside the allocator.
type codedError struct {
	code uint
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

func withCode(code uint, format string, args ...any) error {
	return &codedError{code: code, err: fmt.Errorf(format, args...)}
}

// toCNIError turns any error of a verb into a *types.Error with the right code: typed errors keep
// theirs, lost races, unreachable etcd and deadlines become 11 (try again later), the rest 999.
func toCNIError(err error) error {
	if err == nil {
		return nil
	}
	var te *types.Error
	if errors.As(err, &te) {
		if error(te) != err {
			// Wrapped: the outer text already contains the inner message and details.
			return &types.Error{Code: te.Code, Msg: err.Error()}
		}
		return te
	}
	var ce *codedError
	if errors.As(err, &ce) {
		return &types.Error{Code: ce.code, Msg: err.Error()}
	}
	if errors.Is(err, errConflict) || errors.Is(err, errUnavailable) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return &types.Error{Code: types.ErrTryAgainLater, Msg: err.Error()}
	}
	return &types.Error{Code: types.ErrInternal, Msg: err.Error()}
}
