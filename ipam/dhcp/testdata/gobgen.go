// Makes the gob fixtures of src/rpc.rs with Go's own encoding/gob and net/rpc types (types shaped as the
// reference's skel.CmdArgs and types/100.Result), and decodes ours for a manual check:
//   go run gobgen.go request | response | decode-request HEX | decode-response HEX

package main

import (
	"bytes"
	"encoding/gob"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/rpc"
	"os"
)

type CmdArgs struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string
	Path          string
	NetnsOverride string
	StdinData     []byte
}

type Interface struct {
	Name       string
	Mac        string
	Mtu        int
	Sandbox    string
	SocketPath string
	PciID      string
}

type IPConfig struct {
	Interface *int
	Address   net.IPNet
	Gateway   net.IP
}

type Route struct {
	Dst      net.IPNet
	GW       net.IP
	MTU      int
	AdvMSS   int
	Priority int
	Table    *int
	Scope    *int
}

type DNS struct {
	Nameservers []string
	Domain      string
	Search      []string
	Options     []string
}

type Result struct {
	CNIVersion string
	Interfaces []*Interface
	IPs        []*IPConfig
	Routes     []*Route
	DNS        DNS
}

func main() {
	switch os.Args[1] {
	case "request":
		var b bytes.Buffer
		enc := gob.NewEncoder(&b)
		enc.Encode(&rpc.Request{ServiceMethod: "DHCP.Allocate", Seq: 0})
		enc.Encode(&CmdArgs{ContainerID: "c1", Netns: "/run/netns/p", IfName: "eth0", Args: "K=V", Path: "/opt/cni/bin", StdinData: []byte(`{"a":1}`)})
		fmt.Println(hex.EncodeToString(b.Bytes()))
	case "response":
		var b bytes.Buffer
		enc := gob.NewEncoder(&b)
		enc.Encode(&rpc.Response{ServiceMethod: "DHCP.Allocate", Seq: 5})
		scope := 253
		_, n, _ := net.ParseCIDR("10.77.0.20/24")
		n.IP = net.ParseIP("10.77.0.20")
		_, d, _ := net.ParseCIDR("10.9.0.0/16")
		enc.Encode(&Result{CNIVersion: "1.0.0", IPs: []*IPConfig{{Address: *n, Gateway: net.ParseIP("10.77.0.1")}},
			Routes: []*Route{{Dst: *d, GW: net.IPv4zero, Scope: &scope, Priority: 7}}})
		fmt.Println(hex.EncodeToString(b.Bytes()))
	case "decode-response":
		raw, _ := hex.DecodeString(os.Args[2])
		dec := gob.NewDecoder(bytes.NewReader(raw))
		var resp rpc.Response
		if err := dec.Decode(&resp); err != nil {
			fmt.Println("response:", err)
			os.Exit(1)
		}
		var res Result
		if err := dec.Decode(&res); err != nil {
			fmt.Println("result:", err)
			os.Exit(1)
		}
		j, _ := json.Marshal(res)
		fmt.Printf("%+v %s\n", resp, j)
	case "decode-request":
		raw, _ := hex.DecodeString(os.Args[2])
		dec := gob.NewDecoder(bytes.NewReader(raw))
		var req rpc.Request
		if err := dec.Decode(&req); err != nil {
			fmt.Println("request:", err)
			os.Exit(1)
		}
		var args CmdArgs
		if err := dec.Decode(&args); err != nil {
			fmt.Println("args:", err)
			os.Exit(1)
		}
		fmt.Printf("%+v %+v %s\n", req, args, args.StdinData)
	}
}
