package liveness

import (
	"testing"
	"time"
)

func TestLoop(t *testing.T) {
	var l Loop
	if l.HealthyWithin(time.Hour) {
		t.Fatal("a loop that never turned is healthy")
	}
	l.Turn()
	if !l.HealthyWithin(time.Second) {
		t.Fatal("just turned, not healthy")
	}
	time.Sleep(20 * time.Millisecond)
	if l.HealthyWithin(10 * time.Millisecond) {
		t.Fatal("healthy 20 ms after its last turn, within 10 ms")
	}
	done := l.Busy(time.Now().Add(time.Second))
	if !l.HealthyWithin(10 * time.Millisecond) {
		t.Fatal("busy within its deadline, not healthy")
	}
	time.Sleep(20 * time.Millisecond)
	done()
	if !l.HealthyWithin(10 * time.Millisecond) {
		t.Fatal("unhealthy just after its work ended: the end of the work is a turn")
	}
	time.Sleep(20 * time.Millisecond)
	if l.HealthyWithin(10 * time.Millisecond) {
		t.Fatal("healthy 20 ms after its work ended, within 10 ms")
	}
	l.Busy(time.Now().Add(-time.Second))
	if l.HealthyWithin(10 * time.Millisecond) {
		t.Fatal("healthy past the work's deadline")
	}
}
