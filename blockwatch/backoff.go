package blockwatch

import (
	"math/rand/v2"
	"time"
)

// backoff is a capped exponential backoff with jitter: the n-th consecutive failure waits a random
// duration in [d/2, d] with d = min(max, base*2^n).
type backoff struct {
	base, max time.Duration
	n         int
}

func (b *backoff) next() time.Duration {
	d := b.max
	if b.n < 30 && b.base<<b.n < b.max {
		d = b.base << b.n
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.n = 0 }
