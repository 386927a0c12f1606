package ipamd

import "errors"

// Reasons a node could get no block for an ADD (the reason label of block_ipam_claims_refused_total).
const (
	// refusedBlockLimit: the node holds maxBlocksPerHost blocks of the family, all full.
	refusedBlockLimit = "block_limit"
	// refusedAutoAllocateOff: the node's blocks are full and auto_allocate_blocks is off.
	refusedAutoAllocateOff = "auto_allocate_off"
	// refusedStrictAffinity: no block left to claim, and strict affinity forbids borrowing.
	refusedStrictAffinity = "strict_affinity"
	// refusedPoolExhausted: no block left to claim and no free address to borrow.
	refusedPoolExhausted = "pool_exhausted"
)

var refusalReasons = []string{refusedBlockLimit, refusedAutoAllocateOff, refusedStrictAffinity, refusedPoolExhausted}

// claimRefusal is a pool-exhausted error (CNI code 100) that says why no block could be had.
type claimRefusal struct {
	reason string
	err    error
}

func (e *claimRefusal) Error() string { return e.err.Error() }
func (e *claimRefusal) Unwrap() error { return e.err }

// refuseClaim returns the pool-exhausted error of an ADD refused for reason.
func refuseClaim(reason, format string, args ...any) error {
	return &claimRefusal{reason: reason, err: withCode(ErrPoolExhausted, format, args...)}
}

// refusalReason returns why err refused a claim, "" when it is not such a refusal.
func refusalReason(err error) string {
	var r *claimRefusal
	if errors.As(err, &r) {
		return r.reason
	}
	return ""
}
