// Package sdnotify speaks systemd's notify protocol (sd_notify(3)) without cgo: READY=1, STOPPING=1,
// WATCHDOG=1 and STATUS= datagrams to $NOTIFY_SOCKET. Outside systemd every call is a no-op.
package sdnotify

import (
	"net"
	"os"
	"strconv"
	"time"
)

// Notify sends state (e.g. "READY=1") to the service manager. It returns false, nil when not running
// under systemd's notify protocol.
func Notify(state string) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return false, nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, err
	}
	return true, nil
}

// WatchdogInterval returns how often WATCHDOG=1 must be sent (half the configured timeout, as
// sd_watchdog_enabled(3) recommends), or 0 when the watchdog is not enabled for this process.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
