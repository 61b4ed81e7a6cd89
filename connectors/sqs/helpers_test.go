package sqs_test

import "github.com/epochflow/epochflow/internal/sqstest"

type sqstestQueue = sqstest.QueueOptions
