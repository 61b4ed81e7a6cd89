package main

import (
	"fmt"
	"time"
)

// Kind says which of the three Nexmark entities an Event carries.
type Kind uint8

const (
	// KindPerson is a new person registering on the auction site.
	KindPerson Kind = iota
	// KindAuction is a new auction opened by a seller.
	KindAuction
	// KindBid is a bid on an auction.
	KindBid
)

// String returns "person", "auction" or "bid".
func (k Kind) String() string {
	switch k {
	case KindPerson:
		return "person"
	case KindAuction:
		return "auction"
	case KindBid:
		return "bid"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Person is a user of the auction site, as in the Nexmark model (without its credit card
// number and extra padding, which no query reads).
type Person struct {
	ID       int64
	Name     string
	Email    string
	City     string
	State    string
	DateTime int64 // event time, milliseconds since 1970
}

// Auction is an item put up for sale, as in the Nexmark model (without the extra padding).
type Auction struct {
	ID          int64
	ItemName    string
	Description string
	InitialBid  int64
	Reserve     int64
	DateTime    int64 // event time, milliseconds since 1970
	Expires     int64 // the auction's end, milliseconds since 1970
	Seller      int64 // a Person's ID
	Category    int64
}

// Bid is a bid on an auction, as in the Nexmark model (without the extra padding).
type Bid struct {
	Auction  int64 // an Auction's ID
	Bidder   int64 // a Person's ID
	Price    int64 // in cents
	Channel  string
	URL      string
	DateTime int64 // event time, milliseconds since 1970
}

// Event is one event of the Nexmark stream: exactly one of Person, Auction and Bid is set,
// as Kind says.
type Event struct {
	Kind    Kind
	Person  *Person  `json:",omitempty"`
	Auction *Auction `json:",omitempty"`
	Bid     *Bid     `json:",omitempty"`
}

// Millis returns the event's time in milliseconds since 1970.
func (e Event) Millis() int64 {
	switch e.Kind {
	case KindPerson:
		return e.Person.DateTime
	case KindAuction:
		return e.Auction.DateTime
	}
	return e.Bid.DateTime
}

// Time returns the event's time.
func (e Event) Time() time.Time { return msTime(e.Millis()) }

// String prints the event with all its fields.
func (e Event) String() string {
	switch e.Kind {
	case KindPerson:
		return fmt.Sprintf("person %+v", *e.Person)
	case KindAuction:
		return fmt.Sprintf("auction %+v", *e.Auction)
	}
	return fmt.Sprintf("bid %+v", *e.Bid)
}

// msTime turns milliseconds since 1970 into a time.
func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }
