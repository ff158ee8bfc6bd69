"""Embedded code corpus used to train the default checkpoint's byte-level BPE tokenizer.

Plain text only; changing it changes the default tokenizer (and so every test's token ids).
"""

CORPUS: tuple[str, ...] = (
    '''def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


def quicksort(items):
    if len(items) <= 1:
        return items
    pivot = items[len(items) // 2]
    left = [x for x in items if x < pivot]
    middle = [x for x in items if x == pivot]
    right = [x for x in items if x > pivot]
    return quicksort(left) + middle + quicksort(right)
''',
    '''import os
import sys
import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Optional, List, Dict


@dataclass
class Config:
    name: str
    path: Path
    values: Dict[str, int] = field(default_factory=dict)

    def load(self) -> "Config":
        with open(self.path, "r", encoding="utf-8") as f:
            data = json.load(f)
        self.values.update(data)
        return self


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from empty stack")
        return self._items.pop()

    def __len__(self):
        return len(self._items)


if __name__ == "__main__":
    cfg = Config("main", Path(sys.argv[1])).load()
    print(cfg.values)
''',
    '''import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, hidden_size: int, inner_size: int):
        super().__init__()
        self.c_fc = nn.Linear(hidden_size, inner_size)
        self.c_proj = nn.Linear(inner_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


def train(model, loader, optimizer, epochs=10):
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for batch in loader:
            optimizer.zero_grad()
            loss = model(batch).mean()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.4f}")
''',
    '''function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}

const fetchJson = async (url, options = {}) => {
  const response = await fetch(url, { ...options, headers: { "Content-Type": "application/json" } });
  if (!response.ok) {
    throw new Error(`HTTP ${response.status}: ${response.statusText}`);
  }
  return response.json();
};

export class EventEmitter {
  constructor() {
    this.listeners = new Map();
  }
  on(event, callback) {
    if (!this.listeners.has(event)) {
      this.listeners.set(event, []);
    }
    this.listeners.get(event).push(callback);
    return this;
  }
  emit(event, ...args) {
    const callbacks = this.listeners.get(event) || [];
    callbacks.forEach((cb) => cb(...args));
    return callbacks.length > 0;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const button = document.querySelector("#submit");
  button.addEventListener("click", (event) => {
    event.preventDefault();
    console.log("clicked", event.target.value);
  });
});
''',
    '''SELECT u.id, u.name, COUNT(o.id) AS order_count, SUM(o.total) AS revenue
FROM users AS u
LEFT JOIN orders AS o ON o.user_id = u.id
WHERE u.created_at >= '2024-01-01' AND u.status = 'active'
GROUP BY u.id, u.name
HAVING COUNT(o.id) > 5
ORDER BY revenue DESC
LIMIT 10;

CREATE TABLE IF NOT EXISTS products (
    id INTEGER PRIMARY KEY,
    name VARCHAR(255) NOT NULL,
    price DECIMAL(10, 2) DEFAULT 0.00,
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
);

INSERT INTO products (name, price) VALUES ('keyboard', 49.99), ('mouse', 19.50);
UPDATE products SET price = price * 1.1 WHERE id IN (SELECT product_id FROM sales);
DELETE FROM sessions WHERE expires_at < NOW();
''',
    '''package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
)

type Server struct {
	mu    sync.Mutex
	items map[string]int
}

func NewServer() *Server {
	return &Server{items: make(map[string]int)}
}

func (s *Server) Add(key string, value int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == "" {
		return errors.New("empty key")
	}
	s.items[key] += value
	return nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := json.NewEncoder(w).Encode(s.items); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func main() {
	srv := NewServer()
	for i := 0; i < 10; i++ {
		_ = srv.Add(fmt.Sprintf("key-%d", i), i*i)
	}
	http.ListenAndServe(":8080", srv)
}
''',
    '''#include <stdio.h>
#include <stdlib.h>

typedef struct node {
    int value;
    struct node *next;
} node_t;

int main(int argc, char **argv) {
    node_t *head = NULL;
    for (int i = 0; i < argc; i++) {
        node_t *n = malloc(sizeof(node_t));
        n->value = atoi(argv[i]);
        n->next = head;
        head = n;
    }
    while (head != NULL) {
        printf("%d\\n", head->value);
        head = head->next;
    }
    return 0;
}
''',
    '''fn main() {
    let numbers: Vec<i32> = (1..=10).collect();
    let evens: Vec<i32> = numbers.iter().filter(|&x| x % 2 == 0).cloned().collect();
    match evens.len() {
        0 => println!("none"),
        n => println!("{} even numbers", n),
    }
}
''',
    '''#!/usr/bin/env bash
set -euo pipefail
for file in "$@"; do
  if [ -f "$file" ]; then
    echo "processing $file"
    grep -n "TODO" "$file" || true
  fi
done
''',
    '''# README

This project parses **JSON** and `YAML` files. Install with `pip install -r requirements.txt`.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 255 1024 3.14159 -1 1e-5 0x1F.
Unicode: café, naïve, Straße, 東京, Привет, 🙂.
''',
)
