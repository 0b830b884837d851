package redisproc

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ports are chosen at random below the kernel's ephemeral range when it
// leaves room, so that a client's outgoing connection never holds a
// server's port (nor connects to itself on it while the server is down), and
// never two servers of this process share one. Other processes may still
// take a port between the choice and redis-server's bind: launch catches
// that by the pid that answers.
var (
	portsMu    sync.Mutex
	portsTaken = map[int]bool{}
	portsOnce  sync.Once
	portLo     int
	portHi     int
)

// choosePort is reservePort; tests replace it to hand out a taken port.
var choosePort = reservePort

func portRange() (lo, hi int) {
	portsOnce.Do(func() {
		portLo, portHi = 20000, 60000
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return
		}
		elo, err1 := strconv.Atoi(f[0])
		ehi, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return
		}
		switch {
		case elo-1-portLo >= 2000:
			portHi = min(portHi, elo-1)
		case portHi-(ehi+1) >= 2000:
			portLo = max(portLo, ehi+1)
		}
	})
	return portLo, portHi
}

// reservePort picks a random port that no server of this process holds
// and that accepts a listener right now, and marks it taken.
func reservePort() (int, error) {
	lo, hi := portRange()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := lo + rand.IntN(hi-lo+1)
		if portsTaken[port] {
			continue
		}
		portsTaken[port] = true
		if !portFree(port) {
			continue // left marked: someone else holds it
		}
		return port, nil
	}
	return 0, fmt.Errorf("no free port in %d-%d", lo, hi)
}

// releasePort gives back a port from reservePort.
func releasePort(port int) {
	portsMu.Lock()
	defer portsMu.Unlock()
	delete(portsTaken, port)
}

// portFree reports whether 127.0.0.1:port accepts a listener (with
// SO_REUSEADDR, as redis-server binds).
func portFree(port int) bool {
	l, err := net.Listen("tcp", loopback(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// waitPortFree waits, at most timeout, until port accepts a listener.
func waitPortFree(port int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for !portFree(port) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

func loopback(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
