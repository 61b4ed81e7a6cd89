package sqs

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
)

// API is the part of *sqs.Client (github.com/aws/aws-sdk-go-v2/service/sqs) the connector uses;
// tests can put a stub in its place.
type API interface {
	ReceiveMessage(ctx context.Context, in *awssqs.ReceiveMessageInput, optFns ...func(*awssqs.Options)) (*awssqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, optFns ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *awssqs.ChangeMessageVisibilityInput, optFns ...func(*awssqs.Options)) (*awssqs.ChangeMessageVisibilityOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *awssqs.ChangeMessageVisibilityBatchInput, optFns ...func(*awssqs.Options)) (*awssqs.ChangeMessageVisibilityBatchOutput, error)
	SendMessage(ctx context.Context, in *awssqs.SendMessageInput, optFns ...func(*awssqs.Options)) (*awssqs.SendMessageOutput, error)
	SendMessageBatch(ctx context.Context, in *awssqs.SendMessageBatchInput, optFns ...func(*awssqs.Options)) (*awssqs.SendMessageBatchOutput, error)
	GetQueueAttributes(ctx context.Context, in *awssqs.GetQueueAttributesInput, optFns ...func(*awssqs.Options)) (*awssqs.GetQueueAttributesOutput, error)
}

var _ API = (*awssqs.Client)(nil)

// NewClient returns an SQS client configured the standard AWS way (config.LoadDefaultConfig):
// credentials from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN), the shared files (~/.aws/credentials, ~/.aws/config, AWS_PROFILE), SSO,
// web identity (EKS), or the ECS/EC2 instance role; the region from AWS_REGION or the profile.
//
// endpoint, when not empty, overrides the service endpoint, for emulators such as goaws or
// LocalStack (for example http://127.0.0.1:4100). Then the region defaults to us-east-1 when none
// is configured, and the HTTP transport sees request bodies as plain readers: against a local
// emulator that answers before the request is fully written, Go's transport would otherwise
// take the early answer as a failed write and the SDK would silently resend ReceiveMessage,
// leaving the first answer's messages invisible until their timeout. Emulators ignore the
// credentials, but the SDK still needs some: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to
// any value.
func NewClient(ctx context.Context, endpoint string, optFns ...func(*config.LoadOptions) error) (*awssqs.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx, optFns...)
	if err != nil {
		return nil, fmt.Errorf("sqs: loading the AWS configuration: %w", err)
	}
	if endpoint == "" {
		if cfg.Region == "" {
			return nil, fmt.Errorf("sqs: no AWS region configured: set AWS_REGION (or a region in the AWS profile)")
		}
		return awssqs.NewFromConfig(cfg), nil
	}
	if !strings.HasPrefix(endpoint, "http://") && !strings.HasPrefix(endpoint, "https://") {
		return nil, fmt.Errorf("sqs: endpoint %q: want a URL such as http://127.0.0.1:4100", endpoint)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return awssqs.NewFromConfig(cfg, func(o *awssqs.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.HTTPClient = &http.Client{Transport: plainBodies{tr}}
	}), nil
}

// plainBodies hides the request body's io.WriterTo from the transport (see NewClient).
type plainBodies struct{ base http.RoundTripper }

type plainBody struct{ io.ReadCloser }

func (t plainBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r2 := *r
		r2.Body = plainBody{r.Body}
		r = &r2
	}
	return t.base.RoundTrip(r)
}
