module github.com/epochflow/epochflow

go 1.26.8
