// Command producer is the order service: each order and its OrderCreated
// event in one transaction.
//
// It connects with libpq's PG* variables (PGUSER=order_service: EXECUTE on
// outbox.enqueue and INSERT on orders, nothing else); TOPIC, ORDER_PREFIX
// and ORDERS say where and how many.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// enqueueSQL takes the payload and headers as JSON text, cast in the SQL:
// it works in every pgx query mode (a map works only where pgx knows the
// parameter is jsonb, not in QueryExecModeExec or SimpleProtocol).
const enqueueSQL = `
	SELECT outbox.enqueue(biz_type => $1, biz_key => $2, payload => $3::jsonb,
	                      topic => $4, headers => $5::jsonb)`

type order struct {
	OrderID string `json:"order_id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
}

// enqueue adds the order's event in tx and returns its id.
func enqueue(ctx context.Context, tx pgx.Tx, topic string, o order) (int64, error) {
	payload, err := json.Marshal(o)
	if err != nil {
		return 0, err
	}
	headers := `{"source": "go-example"}`
	var id int64
	err = tx.QueryRow(ctx, enqueueSQL, "OrderCreated", o.OrderID, string(payload), topic, headers).Scan(&id)
	return id, err
}

// placeOrder writes the order and its event in one transaction.
func placeOrder(ctx context.Context, conn *pgx.Conn, topic string, o order) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, sku, qty) VALUES ($1, $2, $3)",
			o.OrderID, o.SKU, o.Qty); err != nil {
			return err
		}
		var err error
		id, err = enqueue(ctx, tx, topic, o)
		return err
	})
	return id, err
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	ctx := context.Background()
	topic := getenv("TOPIC", "orders.go")
	prefix := getenv("ORDER_PREFIX", "go")
	n, err := strconv.Atoi(getenv("ORDERS", "5"))
	if err != nil {
		log.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, "") // the PG* variables
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)

	var last order
	var lastID int64
	for i := 1; i <= n; i++ {
		last = order{OrderID: fmt.Sprintf("%s-%d", prefix, i), SKU: "sku-red", Qty: i}
		if lastID, err = placeOrder(ctx, conn, topic, last); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("order %s: committed with event %d\n", last.OrderID, lastID)
	}

	// A retry of the same call (say, the COMMIT's answer was lost) finds the
	// event and returns its id: nothing new is enqueued.
	var again int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		again, err = enqueue(ctx, tx, topic, last)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	if again != lastID {
		log.Fatalf("retry returned event %d, not %d", again, lastID)
	}
	fmt.Printf("order %s: retried enqueue returned event %d again\n", last.OrderID, again)
}
