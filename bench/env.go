package main

import (
	"bufio"
	"context"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// newEnv connects the shared go-redis client. poolSize 0 keeps go-redis's
// default (10 per GOMAXPROCS).
func newEnv(url string, poolSize int, ttl, retry time.Duration) (*env, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	if poolSize > 0 {
		opt.PoolSize = poolSize
	}
	rdb := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return &env{url: url, rdb: rdb, ttl: ttl, retry: retry}, nil
}

// machine describes where the numbers were taken.
type machine struct {
	GoVersion    string            `json:"go_version"`
	GOOS         string            `json:"goos"`
	GOARCH       string            `json:"goarch"`
	CPU          string            `json:"cpu"`
	NumCPU       int               `json:"num_cpu"`
	GOMAXPROCS   int               `json:"gomaxprocs"`
	RedisVersion string            `json:"redis_version"`
	Tree         string            `json:"tree,omitempty"` // git describe --always --dirty of the checkout, if run inside one
	Modules      map[string]string `json:"modules"`
}

func describeMachine(e *env) machine {
	m := machine{
		GoVersion:  runtime.Version(),
		GOOS:       runtime.GOOS,
		GOARCH:     runtime.GOARCH,
		CPU:        cpuModel(),
		NumCPU:     runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Modules:    map[string]string{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if info, err := e.rdb.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				m.RedisVersion = v
			}
		}
	}
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		m.Tree = strings.TrimSpace(string(out))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			v := d.Version
			if d.Replace != nil {
				v = d.Replace.Path
				if d.Replace.Version != "" {
					v += "@" + d.Replace.Version
				}
			}
			m.Modules[d.Path] = v
		}
	}
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return ""
}

// loadAvg is the 1-minute load average (NaN where unknown): the bench shares
// the machine with whatever else runs, and this says how much did.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return math.NaN()
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}
