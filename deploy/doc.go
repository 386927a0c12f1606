// Package deploy holds the deployment files of vpp-route-agent and block-ipam: the systemd unit and
// its environment file (systemd/), the Kubernetes DaemonSet (kubernetes/) and example CNI network
// configurations (cni/). Its tests check those files against what the binaries accept.
package deploy
