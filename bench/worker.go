package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// A worker is this binary re-executed by the hot-key scenario (-worker): it
// runs some of the waiters in its own OS process, with one client (one
// locker) shared by its waiters, as a service process would.
//
// Protocol, one JSON object per line:
//
//	parent → stdin:  workerConfig
//	worker → stdout: {"ready":true}      after connecting and warming up
//	parent → stdin:  {"start":UNIXNANO}  the same instant for every worker
//	worker → stdout: workerResult        after start+settle+window+tail
//
// Timestamps are wall-clock Unix nanoseconds: every process reads the same
// system clock, so they compare across processes.

type workerConfig struct {
	Impl     string        `json:"impl"`
	URL      string        `json:"url"`
	PoolSize int           `json:"pool_size"`
	TTL      time.Duration `json:"ttl"`
	Retry    time.Duration `json:"retry"`
	Key      string        `json:"key"`
	Worker   int           `json:"worker"`
	First    int           `json:"first"`   // id of this worker's first waiter
	Waiters  int           `json:"waiters"` // waiters in this worker
	Hold     time.Duration `json:"hold"`
	Settle   time.Duration `json:"settle"`
	Window   time.Duration `json:"window"`
	Tail     time.Duration `json:"tail"`
}

type workerStart struct {
	Start int64 `json:"start"`
}

// acquisition is [waiter, requested, acquired, releasing, released] in Unix
// ns: requested before Lock, acquired after it returned, releasing after the
// hold (before Unlock), released after Unlock returned.
type acquisition [5]int64

// pending is [waiter, requested] of a Lock still waiting when the run ended.
type pending [2]int64

type workerResult struct {
	Ready      bool          `json:"ready,omitempty"`
	Worker     int           `json:"worker"`
	Acquired   []acquisition `json:"acquired,omitempty"`
	Pending    []pending     `json:"pending,omitempty"`
	Errors     int           `json:"errors"`
	FirstError string        `json:"first_error,omitempty"`
}

// runWorker is main for -worker. It exits by itself at the latest 2 minutes
// after it was started waiting, or after start+settle+window+tail+60s.
func runWorker(stdin io.Reader, stdout io.Writer) error {
	in := bufio.NewReader(stdin)
	var cfg workerConfig
	if err := readJSONLine(in, &cfg); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	suicide := time.AfterFunc(2*time.Minute, func() {
		fmt.Fprintln(os.Stderr, "bench worker: no start within 2 minutes; exiting")
		os.Exit(3)
	})

	im, ok := registry[cfg.Impl]
	if !ok {
		return fmt.Errorf("worker: unknown implementation %q", cfg.Impl)
	}
	e, err := newEnv(cfg.URL, cfg.PoolSize, cfg.TTL, cfg.Retry)
	if err != nil {
		return err
	}
	defer e.rdb.Close()
	l, err := im.open(e)
	if err != nil {
		return fmt.Errorf("open %s: %w", cfg.Impl, err)
	}
	defer l.Close()

	// Warm up: every waiter takes and releases a private key at once, so
	// connections are dialled and scripts loaded before the clock starts.
	if err := warmUp(l, cfg.Key, cfg.First, cfg.Waiters); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := writeJSONLine(stdout, workerResult{Ready: true, Worker: cfg.Worker}); err != nil {
		return err
	}
	var st workerStart
	if err := readJSONLine(in, &st); err != nil {
		return fmt.Errorf("worker start: %w", err)
	}
	suicide.Stop()
	start := time.Unix(0, st.Start)
	end := start.Add(cfg.Settle + cfg.Window + cfg.Tail)
	time.AfterFunc(time.Until(end)+60*time.Second, func() {
		fmt.Fprintln(os.Stderr, "bench worker: run overran by 60s; exiting")
		os.Exit(3)
	})

	// Every Lock waits until it is obtained or the run ends.
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	time.Sleep(time.Until(start))

	var (
		mu  sync.Mutex
		res = workerResult{Worker: cfg.Worker}
		wg  sync.WaitGroup
	)
	for i := range cfg.Waiters {
		id := int64(cfg.First + i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var acq []acquisition
			var pend []pending
			var errs int
			var firstErr string
			// Bounded in time by end and in count by the cap.
			for n := 0; n < 1_000_000 && time.Now().Before(end); n++ {
				t0 := time.Now()
				h, err := l.Lock(ctx, cfg.Key)
				if err != nil {
					if ctx.Err() != nil {
						pend = append(pend, pending{id, t0.UnixNano()})
						break
					}
					errs++
					if firstErr == "" {
						firstErr = err.Error()
					}
					time.Sleep(time.Millisecond)
					continue
				}
				t1 := time.Now()
				time.Sleep(cfg.Hold)
				t2 := time.Now()
				uctx, ucancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = h.Unlock(uctx)
				ucancel()
				t3 := time.Now()
				if err != nil {
					errs++
					if firstErr == "" {
						firstErr = "unlock: " + err.Error()
					}
				}
				acq = append(acq, acquisition{id, t0.UnixNano(), t1.UnixNano(), t2.UnixNano(), t3.UnixNano()})
			}
			mu.Lock()
			res.Acquired = append(res.Acquired, acq...)
			res.Pending = append(res.Pending, pend...)
			res.Errors += errs
			if res.FirstError == "" {
				res.FirstError = firstErr
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return writeJSONLine(stdout, res)
}

func warmUp(l locker, key string, first, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			k := fmt.Sprintf("%s:warm:%d", key, first+i)
			var err error
			for range 3 {
				var h held
				if h, err = l.Lock(ctx, k); err != nil {
					break
				}
				if err = h.Unlock(ctx); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

func readJSONLine(r *bufio.Reader, v any) error {
	line, err := r.ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return err
	}
	return json.Unmarshal(line, v)
}

func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
