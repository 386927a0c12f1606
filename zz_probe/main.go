package main

import (
	"fmt"
	"os"
	"os/exec"

	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/core"
)

func main() {
	conn, err := core.Connect(socketclient.NewVppClient("/tmp/vx/api.sock"))
	if err != nil { panic(err) }
	ch, _ := conn.NewAPIChannel()
	dump := func(src uint8) {
		req := ch.SendMultiRequest(&ip.IPRouteV2Dump{Src: src, Table: ip.IPTable{}})
		for { d := &ip.IPRouteV2Details{}; last, err := req.ReceiveReply(d); if err != nil || last { break }
			if d.Route.Prefix.Address.Un.GetIP4()[0] != 10 { continue }
			fmt.Printf("src=%d %v/%d src=%d paths=", src, d.Route.Prefix.Address, d.Route.Prefix.Len, d.Route.Src)
			for _, p := range d.Route.Paths { fmt.Printf("[type=%v if=%d nh=%v] ", p.Type, p.SwIfIndex, p.Nh.Address.GetIP4()) }
			fmt.Println() }
		req2 := ch.SendMultiRequest(&ip.IPRouteDump{Table: ip.IPTable{}})
		if src == 0 { for { d := &ip.IPRouteDetails{}; last, err := req2.ReceiveReply(d); if err != nil || last { break }
			if d.Route.Prefix.Address.Un.GetIP4()[0] != 10 { continue }
			fmt.Printf("v1 %v/%d paths=", d.Route.Prefix.Address, d.Route.Prefix.Len)
			for _, p := range d.Route.Paths { fmt.Printf("[type=%v if=%d nh=%v] ", p.Type, p.SwIfIndex, p.Nh.Address.GetIP4()) }
			fmt.Println() } } else { for { d := &ip.IPRouteDetails{}; last, err := req2.ReceiveReply(d); if err != nil || last { break } } }
	}
	if os.Args[1] == "add" {
		rr := &ip.IPRouteAddDelReply{}
		fmt.Println(ch.SendRequest(&ip.IPRouteAddDel{IsAdd: true, Route: ip.IPRoute{Prefix: ip_types.Prefix{Address: ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4([4]byte{10, 244, byte(len(os.Args[2])), 0})}, Len: 26},
			NPaths: 1, Paths: []fib_types.FibPath{{SwIfIndex: 1, Weight: 1, Proto: fib_types.FIB_API_PATH_NH_PROTO_IP4, Nh: fib_types.FibPathNh{Address: ip_types.AddressUnionIP4([4]byte{192, 0, 2, 9})}}}}}).ReceiveReply(rr), rr.Retval)
	}
	if os.Args[1] == "cli" {
		out, _ := exec.Command("/opt/vpp-v26.06-minimal/bin/vppctl", "-s", "/tmp/vx/cli.sock", os.Args[2]).CombinedOutput()
		fmt.Printf("%s", out)
	}
	dump(8); dump(0)
}
