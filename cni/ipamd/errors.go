package ipamd

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// allocation is one address held in a block (an alias: the allocator uses it throughout).
type allocation = cni.Allocation

// Error codes of the allocator (see package cni).
const (
	ErrPluginNotAvailable = cni.ErrPluginNotAvailable
	ErrPoolExhausted      = cni.ErrPoolExhausted
	ErrAddressUnavailable = cni.ErrAddressUnavailable
	ErrDatastore          = cni.ErrDatastore
	ErrCheckFailed        = cni.ErrCheckFailed
)

var configError = cni.ConfigError

func cniError(code uint, format string, args ...any) *types.Error {
	return &types.Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Sentinel and typed errors of the allocator; toCNIError maps them to codes at the verb boundary.
var (
	// errConflict: a conditional write lost to a concurrent writer; the operation is retried.
	errConflict = errors.New("etcd transaction lost a race with a concurrent write")
	// errTooLarge: a write would exceed maxTxnOps operations (etcd refuses it); a batch is split.
	errTooLarge = withCode(ErrDatastore, "the transaction would exceed %d operations", maxTxnOps)
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
func toCNIError(err error) *types.Error {
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
