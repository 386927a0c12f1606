// Package vppapi is everything the route agent needs from fd.io VPP over its binary API, through GoVPP's
// socket client: a connection that Run keeps up (compatibility check, VPP version and pid, restart
// detection, health probes, capped jittered reconnect backoff), uplink set-up, table creation, route dumps
// and pipelined route programming, tunnels, and single-hop BFD sessions with their state events (bfd.go).
//
// The package keeps no route cache: DumpRoutes reads what VPP really has and Apply programs what it is
// given, so the caller reconciles against VPP itself. All netip <-> binapi conversion lives in convert.go.
//
// Every call that talks to VPP takes a context, honours its deadline and also bounds each request by
// Config.ReplyTimeout, because GoVPP's own reply timeout is infinite and a real VPP never answers a message
// it does not know. Calls made while there is no connection fail fast with ErrNotConnected; errors from VPP
// wrap api.VPPApiError and say what was attempted.
package vppapi
