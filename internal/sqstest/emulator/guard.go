package emulator

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Admiral-Piett/goaws/app/models"
)

// guard wraps goaws's handler to make it safe under the race detector. goaws reads its queue
// table (a map) without its lock at the start of most actions and writes it, under the lock, in
// CreateQueue and DeleteQueue; a request still being served from an earlier test (a long poll
// whose client has gone) could race with the next test's CreateQueue. The guard runs CreateQueue
// and DeleteQueue alone and every other action alongside the others.
//
// So that no request holds the guard for long, it does a ReceiveMessage's long poll itself: it
// waits, without the guard, until the queue has a message goaws would hand out or the wait time
// is over (checking every 20 ms, under goaws's own lock), then lets goaws answer at once.
type guard struct {
	mu   sync.RWMutex
	next http.Handler
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch action(r) {
	case "CreateQueue", "DeleteQueue":
		g.mu.Lock()
		defer g.mu.Unlock()
	case "ReceiveMessage":
		if err := longPoll(r); err != nil {
			http.Error(w, "sqstest: "+err.Error(), http.StatusBadRequest)
			return
		}
		g.mu.RLock()
		defer g.mu.RUnlock()
	default:
		g.mu.RLock()
		defer g.mu.RUnlock()
	}
	g.next.ServeHTTP(w, r)
}

// action is the SQS action of a request, read as goaws reads it: from X-Amz-Target for the
// JSON protocol ("AmazonSQS.CreateQueue" gives "CreateQueue"), else from the Action form value
// (query protocol).
func action(r *http.Request) string {
	if t := r.Header.Get("X-Amz-Target"); t != "" {
		_, a, _ := strings.Cut(t, ".")
		return a
	}
	return r.FormValue("Action")
}

// longPoll waits as a ReceiveMessage request asks (its WaitTimeSeconds, or the queue's
// ReceiveMessageWaitTimeSeconds), then rewrites the request's wait to none (-1: goaws takes 0
// as "the queue's default") so that goaws answers at once. Requests it cannot read (query
// protocol, a body that is not JSON) go to goaws unchanged.
func longPoll(r *http.Request) error {
	if r.Header.Get("X-Amz-Target") == "" {
		return nil
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil {
		return nil
	}
	var queueURL string
	var wait int
	_ = json.Unmarshal(req["QueueUrl"], &queueURL)
	_ = json.Unmarshal(req["WaitTimeSeconds"], &wait)
	name := queueURL[strings.LastIndexByte(queueURL, '/')+1:]
	if wait == 0 {
		wait = defaultWait(name)
	}
	deadline := time.Now().Add(time.Duration(wait) * time.Second)
	for !receivable(name) && time.Now().Before(deadline) {
		select {
		case <-r.Context().Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	req["WaitTimeSeconds"] = json.RawMessage("-1")
	body, err = json.Marshal(req)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return nil
}

// defaultWait is the queue's ReceiveMessageWaitTimeSeconds (0 for a queue that does not exist).
func defaultWait(queue string) int {
	models.SyncQueues.RLock()
	defer models.SyncQueues.RUnlock()
	if q, ok := models.SyncQueues.Queues[queue]; ok {
		return q.ReceiveMessageWaitTimeSeconds
	}
	return 0
}

// receivable reports whether the queue holds a message that is neither in flight nor delayed,
// by goaws's own test (so that goaws's receive, called next, ends its wait at once), or whether
// the queue is gone (goaws answers that at once too).
func receivable(queue string) bool {
	models.SyncQueues.RLock()
	defer models.SyncQueues.RUnlock()
	q, ok := models.SyncQueues.Queues[queue]
	if !ok {
		return true
	}
	now := time.Now()
	for _, m := range q.Messages {
		if m.ReceiptHandle == "" && (m.DelaySecs == 0 || !now.Before(m.SentTime.Add(time.Duration(m.DelaySecs)*time.Second))) {
			return true
		}
	}
	return false
}
