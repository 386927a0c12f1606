// Package backoff is the one retry delay of the project: capped exponential backoff with equal jitter.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields, for the n-th consecutive failure, a random delay in [d/2, d] with
// d = min(Max, Base*2^n). The zero value is not usable: set Base and Max. It is not safe for
// concurrent use; each retry loop owns one.
type Backoff struct {
	Base, Max time.Duration
	n         int
}

// Next returns the delay before the next attempt and counts a failure.
func (b *Backoff) Next() time.Duration {
	d := b.Max
	if b.n < 30 && b.Base<<b.n < b.Max {
		d = b.Base << b.n
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

// Reset starts over after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Wait sleeps for Next() and reports false if ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
