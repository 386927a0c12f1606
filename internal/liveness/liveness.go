// Package liveness is the one "is this loop alive" mark of the project's daemons: a loop that turns
// at least every second when idle records each turn, and the deadline of any long work it does; the
// health endpoint and the systemd watchdog read the mark from other goroutines.
package liveness

import (
	"sync/atomic"
	"time"
)

// Loop is the liveness mark of one loop. The zero value is a loop that never turned.
type Loop struct {
	heartbeat atomic.Int64 // UnixNano of the loop's last turn
	// busyUntil is the deadline (UnixNano) of the work the loop is doing now, 0 when idle: the loop is
	// alive until then even if it does not turn.
	busyUntil atomic.Int64
}

// Turn records a turn of the loop.
func (l *Loop) Turn() { l.heartbeat.Store(time.Now().UnixNano()) }

// Busy marks the loop as working until deadline; the returned func ends the mark and records a turn:
// the loop that just finished its work is alive, however long ago it last turned, and the work it does
// before its next turn (unmarked) is measured from here.
func (l *Loop) Busy(deadline time.Time) (done func()) {
	l.busyUntil.Store(deadline.UnixNano())
	return func() {
		l.Turn()
		l.busyUntil.Store(0)
	}
}

// HealthyWithin reports whether the loop has turned within d, or is doing work whose deadline has
// not passed by d.
func (l *Loop) HealthyWithin(d time.Duration) bool {
	now := time.Now()
	if now.Sub(time.Unix(0, l.heartbeat.Load())) < d {
		return true
	}
	until := l.busyUntil.Load()
	return until != 0 && now.UnixNano() < until+int64(d)
}
