package dlock_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"strings"

	"github.com/dlock-go/dlock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// dlock's metrics on a Prometheus /metrics endpoint: an OpenTelemetry
// MeterProvider whose reader is the Prometheus exporter, given to the
// Client. The exporter names each metric the Prometheus way (dots become
// underscores, the unit and _total are appended).
func ExampleWithMeterProvider() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())

	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb, dlock.WithMeterProvider(mp))
	defer locks.Close()

	// In a server: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).
	_ = http.Handler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	ctx := context.Background()
	lease, err := locks.Mutex("invoice:42").Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			value := m.GetGauge().GetValue()
			if h := m.GetHistogram(); h != nil {
				value = float64(h.GetSampleCount())
			}
			fmt.Printf("%s{%s} %v\n", f.GetName(), strings.Join(labels, ","), value)
		}
	}
	// Output:
	// dlock_acquire_duration_seconds{dlock_mode="default",dlock_operation="lock",dlock_outcome="acquired",dlock_primitive="mutex"} 1
	// dlock_hold_duration_seconds{dlock_mode="default",dlock_outcome="unlocked",dlock_primitive="mutex"} 1
	// dlock_leases_held{dlock_mode="default",dlock_primitive="mutex"} 0
	// dlock_release_duration_seconds{dlock_mode="default",dlock_outcome="released",dlock_primitive="mutex"} 1
}
