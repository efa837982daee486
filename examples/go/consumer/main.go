// Command consumer is the inventory service: it reserves stock once per
// OrderCreated event.
//
// It reads TOPIC with the read_committed isolation level; for each record,
// one database transaction claims the event (outbox.claim, arguments from
// the record's headers) and reserves only when the claim is new; the
// offset is committed after that transaction, so a crash in between
// redelivers the record and the claim answers false.  It connects with
// the PG* variables (PGUSER=inventory_service: EXECUTE on outbox.claim,
// INSERT on reservations) and stops after MAX_MESSAGES records (a real
// service loops for ever).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

type order struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// handle claims and applies one record in one transaction; true if applied.
func handle(ctx context.Context, conn *pgx.Conn, consumer string, r *kgo.Record) (bool, error) {
	var o order
	if err := json.Unmarshal(r.Value, &o); err != nil {
		return false, err
	}
	eventID := header(r, "event_id") // decimal text: cast in the SQL
	var claimed bool
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, "SELECT outbox.claim($1, $2::bigint, $3, $4, $5)",
			consumer, eventID, header(r, "biz_type"), header(r, "biz_key"),
			header(r, "outbox_source")).Scan(&claimed)
		if err != nil || !claimed {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, qty, event_id)
			VALUES ($1, $2, $3, $4::bigint)`, o.OrderID, o.SKU, o.Qty, eventID)
		return err
	})
	return claimed, err
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	topic := getenv("TOPIC", "orders.go")
	consumer := getenv("CONSUMER", "inventory-go")
	limit, err := strconv.Atoi(getenv("MAX_MESSAGES", "5"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(getenv("KAFKA_BROKERS", "localhost:9092"), ",")...),
		kgo.ConsumerGroup(getenv("GROUP_ID", "inventory-go")),
		kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	conn, err := pgx.Connect(ctx, "") // the PG* variables
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(context.Background())

	applied, duplicates := 0, 0
	for applied+duplicates < limit {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			log.Fatalf("only %d of %d records within 60 s", applied+duplicates, limit)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			log.Fatal(errs)
		}
		for _, r := range fetches.Records() {
			ok, err := handle(ctx, conn, consumer, r)
			if err != nil {
				log.Fatal(err) // not committed: the record comes again
			}
			outcome := "duplicate, skipped"
			if ok {
				applied++
				outcome = "applied"
			} else {
				duplicates++
			}
			// Only now, after the database committed.
			if err := cl.CommitRecords(ctx, r); err != nil {
				log.Fatal(err)
			}
			fmt.Printf("event %s: %s\n", header(r, "event_id"), outcome)
		}
	}
	fmt.Printf("applied %d, duplicates %d\n", applied, duplicates)
}
