// Command block-ipam is the CNI IPAM plugin that allocates pod addresses from Calico IPAM blocks in
// etcd; see package cni.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/buildinfo"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "install" {
		runInstall()
	}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cni.CmdAdd,
		Del:    cni.CmdDel,
		Check:  cni.CmdCheck,
		GC:     cni.CmdGC,
		Status: cni.CmdStatus,
	}, version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0"), "CNI block-ipam "+buildinfo.Version)
}
