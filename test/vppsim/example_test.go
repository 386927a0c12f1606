package vppsim_test

import (
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// A test starts a simulator on a short socket path, connects GoVPP's real
// socket client and reads the resulting FIB back.
func Example() {
	dir, _ := os.MkdirTemp("", "vs") // unix socket paths are limited to 108 bytes
	defer os.RemoveAll(dir)
	sim, err := vppsim.New(vppsim.Config{Interfaces: []string{"GigabitEthernet0/8/0"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := sim.Listen(filepath.Join(dir, "api.sock")); err != nil {
		log.Fatal(err)
	}
	defer sim.Close()

	conn, err := core.Connect(socketclient.NewVppClient(sim.SocketPath()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Disconnect()
	ch, _ := conn.NewAPIChannel()
	defer ch.Close()
	ch.SetReplyTimeout(time.Second) // GoVPP waits forever by default

	nh := netip.MustParseAddr("172.16.0.2")
	req := &ip.IPRouteAddDel{
		IsAdd: true,
		Route: ip.IPRoute{
			Prefix: ip_types.Prefix{Address: ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4([4]byte{10, 1, 2, 0})}, Len: 26},
			NPaths: 1,
			Paths: []fib_types.FibPath{{
				SwIfIndex: 1, Weight: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4,
				Nh: fib_types.FibPathNh{Address: ip_types.AddressUnionIP4(nh.As4())},
			}},
		},
	}
	if err := ch.SendRequest(req).ReceiveReply(&ip.IPRouteAddDelReply{}); err != nil {
		log.Fatal(err)
	}
	for _, r := range sim.APIRoutes(0) {
		fmt.Println(r.Prefix, r.Source, r.Paths[0].NextHop, r.Paths[0].SwIfIndex)
	}
	fmt.Println(sim.CountRequests("ip_route_add_del"))
	// Output:
	// 10.1.2.0/26 api 172.16.0.2 1
	// 1
}
