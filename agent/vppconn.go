package agent

// vppConn is what the agent knows of the VPP it is connected to. All of it holds since VPP last
// (re)connected, so a connect or a disconnect sets all of it at once; owned by Run. Its states:
//
//	state          fields                  entered by
//	down           zero                    start; Disconnected or Incompatible, from any state (vppDisconnected)
//	up, unread     up                      Connected, from any state: a reconnect or a restarted VPP (vppConnected)
//	up, reading    up, some *Read          dumpTable reads the tunnels (tunnelsRead) and then the routes, which
//	                                       its callers take (routesRead: doFullSync, rebindRoutes, programListed);
//	                                       readBFD the BFD sessions (bfdRead)
//	up, synced     up, every *Read         the first full resync after a connect, which reads the tunnels and
//	                                       routes, then the sessions (when VPP has BFD's API; not in a dry run)
//
// onVPPEvent alone moves it down or up, from vppapi's events, and only that clears a *Read flag. The
// reads may come earlier: programListed dumps the table while the first list goes on, and VPP's
// BFDResync has the sessions read. Down, the agent asks nothing of VPP: every path to a VPP call checks up.
type vppConn struct {
	up bool
	// routesRead says programmed and foreign are a dump of this VPP's table, with the adds and deletes it
	// acknowledged since; before, drift is not counted and the next sync dumps the table.
	routesRead bool
	// tunnelsRead says tun was read from this VPP (its first read logs the tunnels it adopts).
	tunnelsRead bool
	// bfdRead says bfd.sessions were read from this VPP: a state that differs from the last read is a
	// transition (an event lost) only then.
	bfdRead bool
	// vxlanMissingLogged says that this VPP's missing vxlan plugin was logged (the next one may have it).
	vxlanMissingLogged bool
}

// vppConnected resets what the agent knew of VPP before it (re)connected: nothing is read from it yet,
// no uplink is set up in it, no delete is pending a dump; a restarted VPP also has no route, tunnel or
// BFD session of the agent's (the full resync that follows adds them again).
func (a *Agent) vppConnected(restarted bool) {
	a.vpp = vppConn{up: true}
	a.forgetUplinks()
	clear(a.deleted)
	if restarted {
		clear(a.bfd.sessions) // a restarted VPP has none: the full resync creates them again
		clear(a.programmed)   // a restarted VPP has an empty FIB, and no tunnels
		clear(a.undeletable)
		refused := a.tun.refused
		a.tun = newTunnelState()
		a.tun.refused = refused
	}
}

// vppDisconnected forgets what was read from VPP and that the uplinks were set up; no uplink counts as
// waited for until a connected VPP is asked again.
func (a *Agent) vppDisconnected() {
	a.vpp = vppConn{}
	a.forgetUplinks()
	for _, u := range a.uplinks {
		a.setWaitingUplink(u, false)
	}
}

// forgetUplinks marks every uplink as not set up since VPP (re)connected.
func (a *Agent) forgetUplinks() {
	for _, u := range a.uplinks {
		if u.phase == uplinkReady {
			u.phase = uplinkUnknown
		}
	}
}
