package backoff

import (
	"context"
	"testing"
	"time"
)

func TestBackoffDoublesWithJitterUpToTheCap(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	for i := range 40 {
		d := b.Next()
		hi := min(b.Max, b.Base<<min(i, 30))
		if d < hi/2 || d > hi {
			t.Fatalf("attempt %d: %s outside [%s, %s]", i, d, hi/2, hi)
		}
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond || d < 50*time.Millisecond {
		t.Errorf("after reset: %s", d)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	b := Backoff{Base: time.Hour, Max: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if b.Wait(ctx) {
		t.Fatal("Wait returned true although ctx ended")
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("Wait ignored ctx")
	}
	if !(&Backoff{Base: time.Millisecond, Max: time.Millisecond}).Wait(context.Background()) {
		t.Fatal("short Wait failed")
	}
}
